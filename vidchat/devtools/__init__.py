"""Tools for building and checking vidchat: the shared test and benchmark harness."""
