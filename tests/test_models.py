"""--model resolution: real default, tiny fallback with a banner, clear errors."""

from __future__ import annotations

import pytest

from vidchat.app import models
from vidchat.engine import EngineError

pytestmark = pytest.mark.unit


def test_auto_falls_back_to_tiny_with_a_banner_when_the_default_cannot_be_had(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "_hub_model_available", lambda repo: False)
    path, banner = models.resolve_model("auto", str(tmp_path))
    assert (tmp_path / path.split("/")[-1] / "config.json").exists()
    assert banner.startswith(models.TINY_BANNER) and models.DEFAULT_CPU_MODEL in banner


def test_auto_uses_the_default_when_available(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "_hub_model_available", lambda repo: True)
    path, banner = models.resolve_model("auto", str(tmp_path))
    assert path in (models.DEFAULT_CPU_MODEL, models.DEFAULT_GPU_MODEL) and banner is None


def test_folders_and_hub_ids(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(EngineError, match="no such model folder"):
        models.resolve_model(str(tmp_path / "m"), str(tmp_path))
    (tmp_path / "m" / "config.json").write_text("{}")
    assert models.resolve_model(str(tmp_path / "m"), str(tmp_path)) == (str(tmp_path / "m"), None)
    assert models.resolve_model("Qwen/Qwen2.5-VL-3B-Instruct", str(tmp_path)) == ("Qwen/Qwen2.5-VL-3B-Instruct", None)


def test_a_cpu_without_native_bfloat16_is_told_apart_from_one_with_it():
    from vidchat.engine import cpu_has_native_bf16

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert cpu_has_native_bf16(avx2) is False
    assert cpu_has_native_bf16(avx2.replace("fma", "fma avx512f avx512_bf16")) is True
    assert cpu_has_native_bf16(avx2.replace("fma", "amx_tile amx_bf16")) is True
    assert cpu_has_native_bf16("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n") is True  # Arm
    assert cpu_has_native_bf16("processor\t: 0\nFeatures\t: fp asimd\n") is False
    assert cpu_has_native_bf16("") is True  # nothing known: vLLM's own choice stands


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_the_tiny_models_banner_suggests_a_model_that_fits_the_machine(monkeypatch, tmp_path, gpu):
    monkeypatch.setattr(models, "on_gpu", lambda: gpu)
    _, banner = models.resolve_model("tiny", str(tmp_path))
    wanted, other = ((models.DEFAULT_GPU_PRESET, models.DEFAULT_CPU_MODEL) if gpu else
                     (models.DEFAULT_CPU_PRESET, models.DEFAULT_GPU_MODEL))
    assert banner.startswith(models.TINY_BANNER) and f"--model {wanted} " in banner
    assert other not in banner  # never a model this machine can't run
