"""Quality assurance from outside the server: replaying a file or a recorded
bundle through the same pipeline (replay), and a scripted protocol client."""
