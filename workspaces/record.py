"""What a sample's log says about its sandbox workspaces: the record capture writes, restore reads.

The record travels in the sample's own Inspect store, under `STORE_KEY`, so it is written into
the log with the sample (atomically: a log either has it or not) and ingested with it; the
warehouse's `workspaces` view reads it from there (warehouse/workspace_views.py). A log is
hostile input: `WorkspaceRecord.from_store` validates the record and never trusts a path or a
digest it names beyond what its type allows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["NOT_CAPTURED", "STORE_KEY", "SandboxRecord", "WorkspaceRecord"]

STORE_KEY = "gradebook_workspace"
# never in an archive, whatever the task declares: a restored workspace has files only
NOT_CAPTURED = (
    "running processes",
    "network state",
    "file owners and modification times",
    "paths outside the declared ones",
)


class SandboxRecord(BaseModel):
    """One named sandbox of a sample at the end of its generation.

    Attributes:
        name: the sandbox's name (`sandbox("name")`; "default" for the only one).
        status: "captured", or "failed" (capture went wrong; `error` says how).
        paths: the workspace roots archived (absolute paths in the sandbox).
        workdir: the sandbox's working directory (where a relative path or a command with no
            `cwd` goes; restored the same).
        provider: the sandbox provider ("gradebook", "docker", ...).
        image: the image its container ran, when the provider says.
        image_id: the Engine's ID of that image, for a task's own image (gradebook's provider):
            restore uses that very image when the Engine has it.
        recipe: the sha256 of the recipe that image was built from (its compose file or
            Dockerfile and build contexts, one archive in the workspace store beside the
            workspace): restore rebuilds the image from it when the Engine lacks the image.
        recipe_config: the config file's name inside the recipe ("compose.yaml", "Dockerfile").
        service: the recipe's service this sandbox ran.
        user: who the task image's commands ran as.
        environment: the variables the task image's service set.
        config: the task's sandbox config (a file name and its sha256, or the config's fields).
        digest: the archive's sha256 (its address in the store).
        bytes: the archive's size, uncompressed.
        stored_bytes: the stored object's size (compressed; shared by every sample with the
            same digest).
        files: regular files in the archive.
        not_captured: what the archive does not hold (processes, network state, members left
            out and why).
        error: why capture failed.
        seconds: how long capture took.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    status: Literal["captured", "failed"]
    paths: list[str] = Field(default_factory=list)
    workdir: str | None = None
    provider: str | None = None
    image: str | None = None
    image_id: str | None = None
    recipe: str | None = None
    recipe_config: str | None = None
    service: str | None = None
    user: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    config: Any = None
    digest: str | None = None
    bytes: int = 0
    stored_bytes: int = 0
    files: int = 0
    not_captured: list[str] = Field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


class WorkspaceRecord(BaseModel):
    """Every sandbox of a sample, and the store its archives went to."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = 1
    store: str
    sandboxes: list[SandboxRecord]

    def named(self, name: str) -> SandboxRecord | None:
        return next((s for s in self.sandboxes if s.name == name), None)

    @classmethod
    def from_store(cls, store: Any) -> WorkspaceRecord | None:
        """The record in a sample's store (a dict); None when it has none.

        Raises:
            ValueError: a record that is there but malformed (one line).
        """
        if not isinstance(store, dict) or store.get(STORE_KEY) is None:
            return None
        try:
            return cls.model_validate(store[STORE_KEY])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ValueError(f"malformed workspace record ({where}: {first['msg']})") from None
