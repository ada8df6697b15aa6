"""The content-addressed image store (skeleton; implementation follows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vz_core.errors import UnavailableError
from vz_core.paths import cache_dir
from vz_drivers._images._model import Image

__all__ = ["ImageStore", "RegistryCredentials", "default_store_root"]


def default_store_root() -> Path:
    """``vz_core.paths.cache_dir() / "images"``."""
    return cache_dir() / "images"


@dataclass(frozen=True)
class RegistryCredentials:
    """Basic credentials for one registry host; the password never appears in repr, logs or errors."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"RegistryCredentials(username={self.username!r}, password=<redacted>)"


class ImageStore:
    """Local, content-addressed image store shared by drivers."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        insecure_registries: Iterable[str] = (),
        credentials: Mapping[str, RegistryCredentials] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.root = Path(root) if root is not None else default_store_root()
        self.insecure_registries = frozenset(insecure_registries)
        self._credentials = dict(credentials or {})
        self.timeout = timeout

    async def resolve(self, ref: str, *, platform: str = "linux/amd64", refresh: bool = False) -> Image:
        raise UnavailableError("the image store is not implemented yet")

    async def rootfs(self, image: Image) -> Path:
        raise UnavailableError("the image store is not implemented yet")

    def list(self) -> list[Image]:
        return []

    async def remove(self, ref: str) -> bool:
        return False
