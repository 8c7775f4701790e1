"""vidchat's entry point as a file, which a Hugging Face Space runs:
``python app.py --help`` lists every option. The same as ``vidchat serve``
(vidchat.app.main)."""

from vidchat.app.main import exit_now, serve

if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    exit_now(serve())
