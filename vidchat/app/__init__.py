"""The application: server options, the shared state, the FastAPI server that
wires the doors to the conversation core, who may use it (access), and the
hosting helpers (Spaces, TURN, the console, the model that --model names)."""
