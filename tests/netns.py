"""A host of its own network: a Linux network namespace joined to this one by a veth pair, so a
test can cut a "worker host" off from the control host and PostgreSQL (its link down: every packet
either way fails at once with "network unreachable") and give it back. Needs root and iproute2;
:func:`missing_reason` says why not where they are lacking."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


def missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not on PATH"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class SeparateHost:
    netns: str
    outer: str  # this namespace's end of the link (where the host reaches PostgreSQL, the control host)
    inner: str  # the host's own address
    link: str  # the host's end of the veth pair

    @classmethod
    def create(cls, subnet: int) -> SeparateHost:
        """A namespace on 10.213.<subnet>.0/24 (outer .1, inner .2)."""
        tag = f"{os.getpid() % 100000}-{subnet}"
        netns, outer_link, inner_link = f"shotloom-{tag}", f"slo{tag}"[:15], f"sli{tag}"[:15]
        outer, inner = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
        _ip("netns", "add", netns)
        try:
            _ip("link", "add", outer_link, "type", "veth", "peer", "name", inner_link)
            _ip("link", "set", inner_link, "netns", netns)
            _ip("addr", "add", f"{outer}/24", "dev", outer_link)
            _ip("link", "set", outer_link, "up")
            _ip("addr", "add", f"{inner}/24", "dev", inner_link, netns=netns)
            _ip("link", "set", inner_link, "up", netns=netns)
            _ip("link", "set", "lo", "up", netns=netns)
        except BaseException:
            subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)
            raise
        return cls(netns, outer, inner, inner_link)

    @property
    def network(self) -> str:
        return self.outer.rsplit(".", 1)[0] + ".0/24"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the host's network."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def cut(self) -> None:
        _ip("link", "set", self.link, "down", netns=self.netns)

    def restore(self) -> None:
        _ip("link", "set", self.link, "up", netns=self.netns)

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)
