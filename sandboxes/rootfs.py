"""Build a Docker base image from Debian packages, for machines that reach a Debian mirror but no image
registry (the docker backend never pulls at run time; see ``docker_backend``).

``debootstrap`` writes a minimal Debian root filesystem with python3 into a temporary folder, which is
imported as an image. Point the sandbox images at it with ``RL_LLM_DOCKER_BASE_IMAGE=<tag>``::

    sudo python -m rl_llm.sandboxes.rootfs            # builds rl-llm/debian-python:bookworm
    export RL_LLM_DOCKER_BASE_IMAGE=rl-llm/debian-python:bookworm
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from rl_llm.console import ArgumentParser, UnwrappedRawDescriptionHelp

DEFAULT_TAG = "rl-llm/debian-python:bookworm"
# Beyond a minimal Debian (which has bash, coreutils and util-linux's setsid): python3 for run_python and the
# task checks, and procps so that ps and pkill work in the python image as well as in the terminal one.
PACKAGES = ("python3-minimal", "python3", "procps")


def build_base_image(
    tag: str = DEFAULT_TAG, suite: str = "bookworm", mirror: str = "http://deb.debian.org/debian", client=None
) -> str:
    """Build ``tag`` with debootstrap (needs root and the ``debootstrap`` package) and return it."""
    import docker
    from docker.utils import parse_repository_tag

    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    repository, version = parse_repository_tag(tag)
    version = version or "latest"
    with tempfile.TemporaryDirectory(prefix="rl-llm-rootfs-") as scratch:
        root, archive = Path(scratch) / "root", Path(scratch) / "root.tar"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root), mirror],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        client = client or docker.from_env(timeout=600)
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    return f"{repository}:{version}"


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=UnwrappedRawDescriptionHelp)
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--suite", default="bookworm")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian")
    args = parser.parse_args(argv)
    print(build_base_image(args.tag, args.suite, args.mirror))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
