"""The unique-key claims of the Azure Table control store (a mixin of
azure_table.AzureTableControlStore; the contract is base.ControlStore's).

A claim is one small entity in partition "u:<queue>", row the escaped key: ``kind``
"unique", ``at`` (its time) and ``task`` (the task id).  ``create_entity`` is the atomic
insert (EntityAlreadyExists: claimed); a replace or a release is conditional on the etag
read, so of two writers that read the same claim only one succeeds.  Any thread that owns
the store instance (jobq-ctl's main thread, the worker's control thread).
"""

from __future__ import annotations

from typing import Any, Callable, Union

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, UpdateMode

from .base import UniqueClaim, claim_partition, key_part


class AzureClaims:
    _client: TableClient
    _call: Callable[..., Any]

    def _claim_entity(self, claim: UniqueClaim) -> dict[str, Any]:
        return {"PartitionKey": claim_partition(claim.queue), "RowKey": key_part(claim.key),
                "kind": "unique", "at": float(claim.when), "task": claim.task_id}

    def create_claim(self, claim: UniqueClaim) -> bool:
        entity = self._claim_entity(claim)

        def create() -> bool:
            try:
                self._client.create_entity(entity)
            except ResourceExistsError:
                return False
            return True
        return bool(self._call("claim unique key", create))

    def get_claim(self, queue: str, key: str) -> Union[UniqueClaim, None]:
        def get() -> Any:
            try:
                return self._client.get_entity(claim_partition(queue), key_part(key))
            except ResourceNotFoundError:
                return None
        entity = self._call("read unique key", get)
        if entity is None:
            return None
        task, at = entity.get("task"), entity.get("at")
        return UniqueClaim(queue, key, task if isinstance(task, str) else "",
                           float(at) if isinstance(at, (int, float)) else 0.0,
                           str(entity.metadata.get("etag") or ""))

    def replace_claim(self, claim: UniqueClaim, etag: str) -> bool:
        entity = self._claim_entity(claim)

        def replace() -> bool:
            try:
                self._client.update_entity(entity, mode=UpdateMode.REPLACE, etag=etag,
                                           match_condition=MatchConditions.IfNotModified)
            except (ResourceModifiedError, ResourceNotFoundError):
                return False
            return True
        return bool(self._call("replace unique key", replace))

    def release_claim(self, queue: str, key: str, task_id: str) -> None:
        claim = self.get_claim(queue, key)
        if claim is None or claim.task_id != task_id:
            return  # gone, or a later push holds the key now

        def delete() -> None:
            try:
                self._client.delete_entity(claim_partition(queue), key_part(key),
                                           etag=claim.etag,
                                           match_condition=MatchConditions.IfNotModified)
            except (ResourceModifiedError, ResourceNotFoundError):
                pass  # replaced since it was read: the new holder keeps it
        self._call("release unique key", delete)
