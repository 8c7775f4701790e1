"""Deploying as a Hugging Face Space: the card (the README's front matter)
parses and matches what is installed, the pinned GPU install resolves
against the package index, and app.py starts in Space mode with the
environment a Space sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import gradio
import pytest
import yaml
from conftest import ROOT, start_server, stop_server

# The GPU hardware names a Space card may suggest (huggingface_hub's SpaceHardware).
GPU_HARDWARE = {"t4-small", "t4-medium", "l4x1", "l4x4", "l40sx1", "l40sx4", "l40sx8", "a10g-small", "a10g-large",
                "a10g-largex2", "a10g-largex4", "a100-large", "h100", "h100x8"}


def card() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "the README must open with the Space card's front matter"
    return yaml.safe_load(text.split("---\n", 2)[1])


@pytest.mark.unit
def test_the_space_card_parses_and_matches_the_project():
    meta = card()
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gradio.__version__
    assert meta["app_file"] == "app.py" and (ROOT / meta["app_file"]).exists()
    assert meta["app_port"] == 7860 and meta["hf_oauth"] is True  # sign-in from the hosting issue
    assert meta["suggested_hardware"] in GPU_HARDWARE  # vLLM 0.32 needs a CUDA GPU there
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"].startswith(f">={meta['python_version']}")
    assert project["optional-dependencies"]["gpu"] == ["vllm==0.32.0"]
    assert [line for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")] == [".[gpu]"]


@pytest.mark.engine
def test_the_pinned_gpu_install_resolves_against_the_package_index(tmp_path):
    """vllm==0.32.0 and the direct dependencies, resolved for this platform
    (metadata only: nothing is downloaded in full, nothing installed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [*project["optional-dependencies"]["gpu"], *project["dependencies"]]
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                          "--quiet", "--report", str(report), *pins], capture_output=True, text=True, timeout=600)
    if out.returncode != 0 and "Could not find a version" not in out.stderr and "No matching" not in out.stderr:
        pytest.skip(f"the package index could not be reached: {out.stderr[-500:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    assert resolved["vllm"] == "0.32.0"


@pytest.mark.engine
def test_app_starts_in_space_mode_only_with_a_relay(artifacts_dir, tiny_vllm_serve):
    space_env = {"SPACE_ID": "someone/vidchat", "SPACE_HOST": "someone-vidchat.hf.space", "SYSTEM": "spaces"}
    # What is checked is how a Space's start is refused or bound; the answers
    # would come from the suite's shared `vllm serve`.
    args = ["--model", "tiny", "--engine-url", tiny_vllm_serve]
    refused = subprocess.run([sys.executable, str(ROOT / "app.py"), *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, **space_env})
    assert refused.returncode == 2 and "takes no inbound UDP" in refused.stderr, refused.stderr[-2000:]
    relay = json.dumps([{"urls": "turn:turn.example:3478", "username": "u", "credential": "p"}])
    srv = start_server([*args, "--ice-servers", relay], artifacts_dir / "server-space.log",
                       env_extra={**space_env, "VIDCHAT_HF_OAUTH": "off", "VIDCHAT_TOKEN": "space-test-token"})
    try:
        assert "binding 0.0.0.0:" in srv.log()
        assert srv.get_json("/readyz")["ready"] is True
    finally:
        stop_server(srv)
