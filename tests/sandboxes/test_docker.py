"""Docker-specific checks. The attack, session and pool suites also run on docker wherever an engine answers;
here are the parts that need no engine (the images, the error when there is none) and the container
settings."""

from __future__ import annotations

import pytest

from rl_llm.sandboxes import SandboxUnavailable, backend_problem, make
from rl_llm.sandboxes.docker_backend import IMAGES_DIR, default_base_image, dockerfile

from .conftest import TEST_LIMITS, require_backend


def test_images_are_dockerfiles_with_a_local_base_image_argument():
    path = dockerfile("python")
    assert path.parent == IMAGES_DIR
    assert default_base_image(path) == "python:3.11-slim"
    text = path.read_text()
    assert "FROM ${BASE_IMAGE}" in text
    assert "apt-get" not in text and "pip install" not in text  # nothing is downloaded
    with pytest.raises(ValueError, match="python"):
        dockerfile("no-such-image")


def test_without_an_engine_make_says_why():
    problem = backend_problem("docker")
    if problem is None:
        pytest.skip("a Docker engine answers here")
    with pytest.raises(SandboxUnavailable, match="docker"):
        make("docker")


def test_container_is_locked_down():
    require_backend("docker")
    with make("docker", **TEST_LIMITS) as sb:
        attrs = sb._container.attrs["HostConfig"]
        assert attrs["NetworkMode"] == "none" and attrs["ReadonlyRootfs"] is True
        assert attrs["PidsLimit"] == TEST_LIMITS["max_processes"]
        assert attrs["Memory"] == TEST_LIMITS["memory_mb"] * 1024 * 1024
        assert attrs["CapDrop"] == ["ALL"] and "no-new-privileges" in attrs["SecurityOpt"]
        assert sb.run("touch /etc/x").exit_code != 0
        assert sb.run("echo ok > in-workspace && cat in-workspace").stdout == "ok\n"
