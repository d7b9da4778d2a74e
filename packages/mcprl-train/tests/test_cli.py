from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import yaml
from transformers import Qwen3Config

from mcprl_train.cli import _with_default_command, main  # pyright: ignore[reportPrivateUsage]
from mcprl_train.config import Config


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """`train` configures structlog to write to the test's captured stderr and the run's log file."""
    yield
    from mcprl_train.run.tracking import configure_logging

    configure_logging(json_output=True)  # closes the run's log file
    structlog.reset_defaults()


def test_train_is_the_default_subcommand() -> None:
    assert _with_default_command([]) == ["train"]
    assert _with_default_command(["--profile", "cpu"]) == ["train", "--profile", "cpu"]
    assert _with_default_command(["plan", "--profile", "a100x2"]) == ["plan", "--profile", "a100x2"]
    assert _with_default_command(["--help"]) == ["--help"]
    assert _with_default_command(["--debug"]) == ["--debug", "train"]
    assert _with_default_command(["--debug", "config"]) == ["--debug", "config"]


def test_config_prints_the_resolved_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text("grpo:\n  kl_coef: 0.02\n")
    code = main(["config", "--profile", "a100x2", "--config", str(user), "--set", "run.steps=3"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    config = Config.from_dict(printed)
    assert (config.profile, config.run.steps, config.grpo.kl_coef) == ("a100x2", 3, 0.02)
    assert config.distributed.zero_stage == 3


def test_a_bad_key_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--set", "grpo.grup_size=3"]) == 2
    assert "unknown config key 'grpo.grup_size'; did you mean 'grpo.group_size'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tasks.train=nope.json", "error: train task file 'nope.json' does not exist"),
        ("tools.servers=nope.json", "error: nope.json: cannot read servers config: [Errno 2] No such file"),
    ],
)
def test_a_mistyped_path_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, override: str, message: str
) -> None:
    assert main(["train", "--set", override, "--set", f"run.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(message)
    assert "Traceback" not in err


def test_a_bad_task_file_fails_before_a_run_directory_is_created(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "a", "prompt": "q", "answer": "2"}\n')
    args = ["train", "--run-name", "r", "--set", f"run.output_dir={tmp_path / 'runs'}"]
    assert main([*args, "--set", f"tasks.train={bad}"]) == 2
    assert not (tmp_path / "runs" / "r").exists()  # the name stays free for the corrected run


def test_debug_prints_the_traceback_instead(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["--set", "tools.servers=nope.json", "--set", f"run.output_dir={tmp_path}"]
    assert main(["--debug", "train", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "mcprl_tools.errors.ConfigError: nope.json: cannot read servers config" in err
    assert not [line for line in err.splitlines() if line.startswith("error:")]


def test_debug_is_accepted_after_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--debug", "--set", "grpo.grup_size=3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "unknown config key 'grpo.grup_size'" in err


def _small_qwen3(tmp_path: Path) -> Path:
    """A two-layer Qwen3's config.json (no weights: `plan` reads the shape only)."""
    Qwen3Config(  # pyright: ignore[reportUnknownMemberType]  # save_pretrained: transformers leaves **kwargs unannotated
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_plan_of_a_local_model_prints_the_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["plan", "--profile", "a100x2", "--model", str(_small_qwen3(tmp_path))])
    out = capsys.readouterr().out
    assert code == 0
    assert "optimizer states" in out
    assert "fits" in out


def test_plan_exits_1_when_the_model_does_not_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        ["plan", "--model", str(_small_qwen3(tmp_path)), "--set", "distributed.device_memory_gb=0.001"]
    )
    assert code == 1
    assert "does not fit" in capsys.readouterr().out


def test_plan_for_a_cached_hub_model_works_offline(tmp_path: Path) -> None:
    """`mcprl-train plan --profile a100x2` reads Qwen/Qwen3-0.6B's config from the Hugging Face cache."""
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / ("0" * 40)
    Qwen3Config(  # pyright: ignore[reportUnknownMemberType]  # save_pretrained: transformers leaves **kwargs unannotated
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ).save_pretrained(snapshot)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", "mcprl_train", "plan", "--profile", "a100x2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Qwen/Qwen3-0.6B: 596.0 M params" in proc.stdout
    assert "fits" in proc.stdout


def test_doctor_without_servers_reports_the_cpu_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--skip-servers"])
    out = capsys.readouterr().out
    assert "installation: mcprl_grpo" in out
    assert "tasks: tasks.train" in out
    assert code in (0, 1)
    assert ("all checks passed" in out) == (code == 0)


def test_resume_without_a_run_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["train", "--resume", "--set", f"run.output_dir={tmp_path}"]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_plots_subcommand_writes_pngs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from mcprl_train.run.run_dir import RunDir

    run_dir = RunDir.create(Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=x"]))
    run_dir.write_metrics("grpo", 1, {"rollout/reward_mean": 0.5, "loss/kl": 0.1})
    assert main(["plots", str(run_dir.path)]) == 0
    assert {Path(p).name for p in capsys.readouterr().out.split()} == {"reward.png", "kl.png", "losses.png"}
    assert json.loads(run_dir.metrics_path.read_text())["step"] == 1


def test_training_a_deepspeed_profile_relaunches_itself_under_torchrun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    calls: list[list[str]] = []

    def fake_run(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr("mcprl_train.parallel.launch.subprocess.run", fake_run)
    args = ["--profile", "a100x2", "--set", f"run.output_dir={tmp_path}", "--set", "model.device=cpu"]
    assert main(args) == 3  # the workers' exit code
    [command] = calls
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "2"  # distributed.num_gpus of the profile
    assert command[command.index("-m", 3) :] == ["-m", "mcprl_train", *args]
    assert not list(tmp_path.iterdir())  # the launching process creates nothing


def test_a_deepspeed_run_needs_a_gpu_per_process_on_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert main(["--profile", "a100x2", "--set", f"run.output_dir={tmp_path}"]) == 2
    assert "distributed.num_gpus=1" in capsys.readouterr().err


def test_the_deepspeed_launchers_local_rank_argument_is_dropped() -> None:
    from mcprl_train.parallel.launch import launched, strip_local_rank

    assert strip_local_rank(["--local_rank=1", "--profile", "a100x2"]) == ["--profile", "a100x2"]
    assert strip_local_rank(["--local-rank", "0", "train"]) == ["train"]
    assert launched({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert not launched({"WORLD_SIZE": "2"})
