"""Input assets (stored input resources, content-addressed) and characters (named references
whose files are input assets)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.exc import IntegrityError

from api.core.records import CharacterRecord, InputAssetRecord
from api.store.engine import StoreEngine
from api.store.tables import Character, InputAsset


def _asset_record(row: InputAsset) -> InputAssetRecord:
    return InputAssetRecord(
        sha256=row.sha256,
        path=row.path,
        media_type=row.media_type,
        bytes=row.bytes,
        created_at=row.created_at,
    )


class AssetStore(StoreEngine):
    def put_input_asset(self, sha256: str, path: str, media_type: str, size: int) -> InputAssetRecord:
        """Record a stored input resource (content-addressed: the first record for a digest wins)."""
        try:
            with self._write() as s:
                existing = s.get(InputAsset, sha256)
                if existing is not None:
                    return _asset_record(existing)
                row = InputAsset(
                    sha256=sha256, path=path, media_type=media_type, bytes=size, created_at=time.time()
                )
                s.add(row)
                s.flush()
                return _asset_record(row)
        except IntegrityError:  # a concurrent writer (non-SQLite backends) stored it first
            found = self.get_input_asset(sha256)
            if found is None:
                raise
            return found

    def get_input_asset(self, sha256: str) -> InputAssetRecord | None:
        with self._read() as s:
            row = s.get(InputAsset, sha256)
            return _asset_record(row) if row is not None else None

    # -- characters -------------------------------------------------------------------------------
    def put_character(
        self,
        character_id: str,
        name: str,
        image_sha256: str,
        audio_sha256: str | None,
        source: dict[str, Any],
        submitter: str | None,
    ) -> CharacterRecord:
        """Record a character (content-addressed: the same name and media give the same id, and
        the first record of an id wins)."""
        with self._write() as s:
            if s.get(Character, character_id) is None:
                s.add(
                    Character(
                        character_id=character_id,
                        name=name,
                        image_sha256=image_sha256,
                        audio_sha256=audio_sha256,
                        source=source,
                        submitter=submitter,
                        created_at=time.time(),
                    )
                )
        found = self.get_character(character_id)
        assert found is not None
        return found

    def get_character(self, character_id: str) -> CharacterRecord | None:
        with self._read() as s:
            row = s.get(Character, character_id)
            if row is None:
                return None
            image = s.get(InputAsset, row.image_sha256)
            audio = s.get(InputAsset, row.audio_sha256) if row.audio_sha256 else None
            return CharacterRecord(
                character_id=row.character_id,
                name=row.name,
                image=_asset_record(image),
                audio=_asset_record(audio) if audio is not None else None,
                source=row.source,
                submitter=row.submitter,
                created_at=row.created_at,
            )
