"""Runs the SAM CLI with `--docker-network host` working on Linux.

The local stack (Postgres, Redis, SeaweedFS, moto) listens on 127.0.0.1
only, so a function under `sam local invoke` must share the host's network
to reach it. SAM CLI 1.170 accepts `--docker-network host` but only skips
connecting the container to a network named "host": the container stays on
the default bridge, and 127.0.0.1 inside it is not the host's
(aws-sam-cli#4236, #6347). This wrapper makes the option do what it says:

- the container is created with `network_mode="host"` (and no published
  ports, which host networking has no use for);
- the runtime interface emulator listens on 127.0.0.1 at the port SAM
  already chose for it, and its runtime API on another free loopback port,
  instead of 0.0.0.0:8080 and 127.0.0.1:9001, which may be taken on the host.

Any other network, or none, is left exactly as SAM does it.

    .venv/bin/python scripts/lib/sam_host_network.py local invoke Fn -e ev.json --docker-network host ...
"""

import socket
import sys

from docker.models.containers import ContainerCollection
from samcli.local.docker import container as sam_container

RIE = "aws-lambda-rie"


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_sam_create = sam_container.Container.create


def _create(self, context):
    if self.network_id == "host":
        self._container_opts = {**(self._container_opts or {}), "network_mode": "host"}
        entrypoint = list(self._entrypoint or [])
        if entrypoint and entrypoint[0].endswith(RIE):
            entrypoint += [
                "--runtime-interface-emulator-address",
                f"127.0.0.1:{self.rapid_port_host}",
                "--runtime-api-address",
                f"127.0.0.1:{_free_loopback_port()}",
            ]
            self._entrypoint = entrypoint
    return _sam_create(self, context)


_docker_create = ContainerCollection.create


def _docker_create_host(self, image, command=None, **kwargs):
    if kwargs.get("network_mode") == "host":
        kwargs.pop("ports", None)
    return _docker_create(self, image, command, **kwargs)


sam_container.Container.create = _create
ContainerCollection.create = _docker_create_host

if __name__ == "__main__":
    from samcli.cli.main import cli

    sys.exit(cli(prog_name="sam"))
