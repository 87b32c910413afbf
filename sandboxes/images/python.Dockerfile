# Sandbox image for the rl-llm docker backend (rl_llm.sandboxes.docker_backend.ensure_image builds it on first
# use and tags it by content hash). Nothing is downloaded while building: the base image must already be
# present locally (`docker pull python:3.11-slim` once), and no package manager runs.
# Debian slim images already carry what the sandbox needs: bash, coreutils, util-linux (setsid) and python3.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# No home directories: the sandbox user's home is /workspace, and / shows no more than it needs.
RUN rm -rf /home /root && mkdir -p /workspace /run/rl-io && chmod 1777 /workspace
ENV HOME=/workspace LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
WORKDIR /workspace
CMD ["sleep", "infinity"]
