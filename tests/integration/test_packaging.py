"""Packaging and config safety: presets ship inside the package (a wheel installed elsewhere trains), a preset is
a name and a config file must be for the requested task, values that cannot train are refused before the run
folder exists, and TOML is read on Python 3.10 through tomli."""

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from fnmatch import fnmatch

import pytest
from helpers.paths import HELPERS, REPO_ROOT
from helpers.venv_helper import checked, venv_reusing_these_packages

from longsparse import cpu_kernel
from longsparse.cli import main
from longsparse.train import ConfigError, build_config, configs_dir, train

ROOT = REPO_ROOT
TINY = [
    "model.d_model=16",
    "model.d_ff=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "train.batch_size=4",
    "train.warmup_steps=1",
    "train.log_every=1",
    "train.val_every=0",
    "train.val_samples=2",
    "train.val_lengths=[32]",
    "train.threads=1",
]


# ---- 8: a preset is a name; a config is for the requested task ------------------------------------------
@pytest.mark.parametrize("preset", ["../copy/cpu", "copy/cpu", "..", ".cpu", "/tmp/cpu", "..\\copy\\cpu"])
def test_preset_must_be_a_name(preset):
    with pytest.raises(
        ConfigError,
        match=r"preset must be a name, not a path.*presets of task 'flip_flop': "
        r"cpu, paper",
    ):
        build_config("flip_flop", preset=preset)


def test_cli_path_preset_trains_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    tiny = ["--steps", "1", *[x for s in TINY for x in ("--set", s)]]  # if it trained, only briefly
    assert main(["train", "--task", "flip_flop", "--preset", "../copy/cpu", "--out", str(out), *tiny]) == 2
    assert "preset must be a name" in capsys.readouterr().err
    assert not out.exists()


def test_config_of_another_task_is_refused(tmp_path, capsys):
    copy_cpu = configs_dir() / "copy" / "cpu.toml"
    with pytest.raises(
        ConfigError,
        match=r"cpu\.toml is a config for task 'copy', not for the requested task "
        r"'flip_flop'",
    ):
        build_config("flip_flop", config_file=str(copy_cpu))
    with pytest.raises(ConfigError, match="task.name='copy', not the requested task 'flip_flop'"):
        build_config("flip_flop", sets=["task.name='copy'"])
    out = tmp_path / "r"
    assert main(["train", "--task", "flip_flop", "--config", str(copy_cpu), "--out", str(out)]) == 2
    assert "config for task 'copy'" in capsys.readouterr().err
    assert not out.exists()
    # the same task under an alias, or a file that names no task, is that task
    assert (
        build_config("flipflop", config_file=str(configs_dir() / "flip_flop" / "cpu.toml"))["task"]["name"]
        == "flip_flop"
    )
    bare = tmp_path / "bare.toml"
    bare.write_text('[model.attention]\nmethod = "softmax"\npositions = "nape"\n')
    assert build_config("copy", config_file=str(bare))["task"]["name"] == "copy"


# ---- 10: values that cannot train are refused before anything is written ---------------------------------
@pytest.mark.parametrize(
    "bad,match",
    [
        ("train.lr=inf", "train.lr must be a finite number, got inf"),
        ("train.lr=nan", "train.lr must be a finite number, got nan"),
        ("train.lr=-1e-3", "train.lr must be a number > 0"),
        ("train.min_lr_ratio=nan", "train.min_lr_ratio must be a finite number"),
        ("train.min_lr_ratio=2.0", r"train.min_lr_ratio must be a number in \[0, 1\]"),
        ("train.weight_decay=nan", "train.weight_decay must be a finite number"),
        ("train.weight_decay=-0.1", "train.weight_decay must be a number >= 0"),
        ("train.grad_clip=inf", "train.grad_clip must be a finite number"),
        ("train.betas=[0.9, nan]", r"train.betas\[1\] must be a finite number"),
        ("model.attention.alpha=inf", "model.attention.alpha must be a finite number, got inf"),
        ("model.init_std=nan", "model.init_std must be a finite number"),
        ("task.params.write_prob=nan", "task.params.write_prob must be a finite number"),
    ],
)
def test_untrainable_values_refused_before_the_run_folder(tmp_path, capsys, bad, match):
    with pytest.raises(ConfigError, match=match):
        build_config("flip_flop", sets=[bad])
    out = tmp_path / "r"
    assert main(["train", "--task", "flip_flop", "--out", str(out), "--set", bad]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line naming the problem
    assert not out.exists()


def test_train_validates_a_raw_config_before_creating_the_folder(tmp_path):
    cfg = build_config("flip_flop", method="softmax", sets=TINY)
    cfg["train"]["lr"] = float("inf")
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match="train.lr must be a finite number"):
        train(cfg, str(out))
    assert not out.exists()


# ---- 15: TOML on Python 3.10 -----------------------------------------------------------------------------
def test_toml_read_through_tomli_without_tomllib():
    """Python 3.10 has no tomllib: config reading must use tomli (same API), not fail."""
    code = textwrap.dedent("""
        import sys, tomllib, types
        tomli = types.ModuleType("tomli")          # stands in for the tomli package
        tomli.load, tomli.loads, tomli.TOMLDecodeError = tomllib.load, tomllib.loads, tomllib.TOMLDecodeError
        sys.modules["tomli"], sys.modules["tomllib"] = tomli, None      # None: `import tomllib` fails
        from longsparse.train import config
        from longsparse.train.config import presets
        assert presets.tomllib is tomli, presets.tomllib
        assert config.parse_value("[1, 2]") == [1, 2]
        cfg = config.build_config("flip_flop", preset="cpu", steps=3)
        assert cfg["train"]["steps"] == 3, cfg
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_pyproject_declares_tomli_and_ships_the_presets():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert 'tomli>=1.1; python_version < "3.11"' in meta["project"]["dependencies"]
    assert "configs/*/*.toml" in meta["tool"]["setuptools"]["package-data"]["longsparse"]
    assert "configs/*/*.toml" in meta["tool"]["setuptools"]["package-data"]["longsparse_experiments"]
    assert meta["project"]["scripts"]["longsparse"] == "longsparse_experiments.cli:main"
    assert not (ROOT / "configs").exists()  # one place for the presets: the package


def test_every_kernel_source_is_built_and_shipped():
    """Every C++ file of the package is one the kernel build copies and hashes (cpu_kernel.FILES: a file left out
    would be compiled from a stale copy or not found) and matches the wheel's package data."""
    import tomllib

    package = ROOT / "src" / "longsparse"
    on_disk = sorted(str(p.relative_to(package)) for pattern in ("*.cpp", "*.h") for p in package.rglob(pattern))
    assert len(on_disk) >= 6 and sorted(cpu_kernel.FILES) == on_disk
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["longsparse"]
    assert [rel for rel in on_disk if not any(fnmatch(rel, g) for g in globs)] == []
    assert configs_dir() == ROOT / "src" / "longsparse" / "configs" or "LONGSPARSE_CONFIGS" in os.environ
    # the task presets are the library's, the study presets the experiments'
    from longsparse_experiments.presets import presets_dir

    assert presets_dir() == ROOT / "src" / "longsparse_experiments" / "configs"
    assert not (ROOT / "src" / "longsparse" / "configs" / "reproduce").exists()
    assert (presets_dir() / "reproduce" / "synthetic.toml").is_file() and (presets_dir() / "lm" / "cpu.toml").is_file()


# ---- 14: a wheel installed elsewhere runs the commands that need presets ----------------------------------
def test_a_venv_reusing_these_packages_works_from_a_venv_too(tmp_path):
    """The helper works from a plain interpreter and from inside a venv (the case `venv --system-site-packages`
    got wrong): torch imports in the venv it makes, and in one it makes from inside that venv."""
    probe = "import sys, torch; print(sys.prefix)"
    py = venv_reusing_these_packages(tmp_path / "outer")
    assert checked([py, "-c", probe]).stdout.strip() == str(tmp_path / "outer")
    make_inner = (
        f"import sys; sys.path.insert(0, {str(HELPERS)!r}); from pathlib import Path; "
        f"from venv_helper import venv_reusing_these_packages as v; print(v(Path({str(tmp_path / 'inner')!r})))"
    )
    inner_py = checked([py, "-c", make_inner], timeout=300).stdout.strip()
    assert checked([inner_py, "-c", probe]).stdout.strip() == str(tmp_path / "inner")


def test_wheel_install_runs_presets_from_another_folder(tmp_path):
    """Build the wheel from a copy of the sources, install it (no deps) into a fresh venv that reuses this
    interpreter's torch, and from a folder outside the checkout: both packages come from the wheel, the demo's
    task preset and the study and LM presets resolve inside it, a run trains and a study dry-runs. Passes from a
    plain interpreter and from inside a venv."""
    src = tmp_path / "src-copy"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.so")
    shutil.copytree(ROOT / "src", src / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    checked(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src], timeout=300
    )
    (wheel,) = dist.glob("longsparse-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {f"longsparse/{rel}" for rel in cpu_kernel.FILES} <= shipped  # the kernels build from the wheel's sources
    venv = tmp_path / "venv"
    py = venv_reusing_these_packages(venv)
    cli = venv / "bin" / "longsparse"
    checked([py, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", wheel], timeout=300)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LONGSPARSE_CONFIGS", "PYTHONPATH")}

    def run(*args):
        res = subprocess.run(
            [str(cli), *args], check=False, cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        return res.stdout

    where = checked(
        [
            py,
            "-c",
            textwrap.dedent("""
        from longsparse.train import configs_dir
        from longsparse_experiments import demo, figures, lm_study, study
        from longsparse_experiments.presets import presets_dir
        for (method, positions), cfg in demo.run_configs().items():    # the configs run_demo trains
            assert cfg["model"]["attention"]["method"] == method and cfg["task"]["name"] == demo.RECIPE["task"], cfg
        lm = lm_study.load_study_config("quick")
        assert lm.study.methods, lm
        print(configs_dir(), presets_dir(), study.load_study("synthetic", quick=True).path, lm.data.dir,
              figures.__file__)
    """),
        ],
        cwd=work,
        env=env,
    ).stdout.split()
    assert len(where) == 5 and all(w.startswith(str(venv)) for w in where), where  # the wheel's, not the checkout's
    out = run("presets")
    assert "flip_flop" in out and "synthetic-quick" in out
    run(
        "train",
        "--task",
        "flip_flop",
        "--method",
        "softmax",
        "--preset",
        "cpu",
        "--steps",
        "2",
        "--out",
        "run",
        *[x for s in TINY for x in ("--set", s)],
    )
    assert (work / "run" / "checkpoints" / "last.pt").is_file()
    assert "would train" in run(
        "reproduce", "synthetic", "--quick", "--dry-run", "--out", "rep", "--report", "rep-report"
    )


@pytest.mark.parametrize("target", ["demo", "test", "setup", "setup-dev", "lint"])
def test_make_targets_run_through_the_given_python(target):
    """`make demo PY=/path/to/python` must not need that environment activated: every command of every README
    target starts with $(PY) (a bare `longsparse` was looked up on PATH: `longsparse: No such file`)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    py = "/opt/some-venv/bin/python"
    lines = checked(["make", "-n", "-C", ROOT, target, f"PY={py}"]).stdout.splitlines()
    commands = [ln for ln in lines if ln.strip() and not ln.startswith("make")]
    assert commands and all(c.startswith(py + " ") for c in commands), commands


def test_no_numpy_warning_without_numpy():
    """torch warns "Failed to initialize NumPy" on import when NumPy is absent; longsparse (which needs no NumPy)
    must not show it on every command, even --help."""
    code = (
        "import sys; sys.modules['numpy'] = None\n"  # as if NumPy were not installed
        "from longsparse_experiments.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "import longsparse, torch; print(longsparse.entmax15(torch.zeros(3)).tolist())"
    )
    res = checked([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=120)
    assert "NumPy" not in res.stderr and "numpy" not in res.stderr.lower(), res.stderr
    assert "[0.3333" in res.stdout
