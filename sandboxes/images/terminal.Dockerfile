# Sandbox image for rl-llm/Terminal-v0 with the docker backend: everything the generated task families and
# their checks use. TerminalEnv picks it (image="terminal") when the backend is docker.
#   families -> tools: files/text/logs (coreutils, findutils, grep, sed, gawk, gzip), data (python3 csv/json,
#   jq), scripting (bash, python3), permissions (chmod), archives (tar, gzip, xz, zip), config (cron syntax
#   only, no daemon), git (git), sqlite (python3's sqlite3 module; the sqlite3 CLI for agents).
# Unlike python.Dockerfile this build runs apt-get, so it needs the Debian mirrors once; afterwards the image is
# cached by content hash like the others.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends git sqlite3 jq gawk file procps less tree xz-utils zip unzip bzip2 \
 && rm -rf /var/lib/apt/lists/*
# No home directories: the sandbox user's home is /workspace, and / shows no more than it needs.
RUN rm -rf /home /root && mkdir -p /workspace /run/rl-io && chmod 1777 /workspace
ENV HOME=/workspace LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 GIT_CONFIG_NOSYSTEM=1
WORKDIR /workspace
CMD ["sleep", "infinity"]
