"""Accepting jobs: shots (with their inputs, characters, memory from earlier shots, guides, a
source video, an extension's source), merges, and re-renders of earlier shots, from any dialect.

Order matters for the promises both dialects make: the idempotency key is checked before any
input is fetched (a replay costs nothing); the shot is checked by the rule book; every input is
decoded and stored before the job is accepted (invalid media is refused and nothing is queued);
the job row is committed before the answer is sent.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Any

from api.core.errors import Conflict, InvalidField
from api.core.inputs import MEDIA_SIZE, InputAsset, InputError, Role, copy_into_assets
from api.core.records import CharacterRecord, InputAssetRecord, JobRecord
from api.core.references import kept_reference
from api.core.rules import check_path_part
from api.core.shared import Accepted, SharedSteps, run_kind
from api.core.specs import GuideRef, InputRef, MemoryRef, MergeSpec, ShotSpec, SourceRef
from api.core.steps import MERGE_JOB, R2V_JOB, stills_step, stitch_step
from api.store import NewJob, payload_hash
from contracts.runs import MERGE_OP, SHOT_OP, MergeConfig, ShotConfig, run_config
from contracts.tags import KIND_TAG, USER_TAG
from shotloom.capabilities import Capabilities, CapabilityError
from shotloom.request import Guide


class Intake(SharedSteps):
    def accept_shot(self, spec: ShotSpec) -> Accepted:
        digest = payload_hash(spec.idempotency_payload)
        replay = self.replay(spec.job_id, "r2v", digest)
        if replay is not None:
            return Accepted(replay, False)
        self.rules.check_names(spec)
        self.check_queue("r2v")
        caps = self.capabilities()
        self.rules.check_sampling(spec, caps)
        if caps is not None:
            self.rules.check(spec, caps)

        inputs: dict[str, Any] = {}
        config: dict[str, Any] = {"work_id": spec.work_id, "shot_id": spec.shot_id, "prompt": spec.prompt}
        for key in (
            "negative_prompt", "seed", "width", "height", "num_frames", "fps", "guidance_scale",
            "num_inference_steps", "step_cache",
        ):  # fmt: skip
            if getattr(spec, key) is not None:
                config[key] = getattr(spec, key)
        for key in ("first_frame", "last_frame"):
            ref: InputRef | None = getattr(spec, key)
            if ref is not None:
                asset = self.resolve(ref, "image")
                config[key] = str(asset.path)
                inputs[ref.field] = describe(asset)
        if spec.source is not None:
            asset, described = self._source_video(spec.source)
            config["source_video"] = str(asset.path)
            inputs[spec.source.field] = described
        if spec.strength is not None:
            config["strength"] = spec.strength
        for key in ("lora", "lora_scale"):
            if getattr(spec, key) is not None:
                config[key] = getattr(spec, key)
        stitch, memory, before_frames = None, [], 0
        if spec.extends is not None:
            stitch, source_memory, before_frames = self._extension(spec, caps, config, inputs)
        for slot in spec.memory:
            origin: dict[str, Any] = {}  # where a slot came from: an earlier version, a character
            if slot.character_id is not None:
                image, audio = self._character_memory(slot, caps is None or caps.audio_in)
                origin = {"character_id": slot.character_id}
            elif slot.shot_id is not None:
                with_audio = caps is None or caps.audio_in
                image, audio, version = self._shot_memory(
                    spec.work_id, slot.shot_id, f"{slot.field}.shot_id", with_audio
                )
                origin = {"version_id": version, "shot_id": slot.shot_id}
            else:
                assert slot.image is not None
                image = self.resolve(slot.image, "image")
                audio = self.resolve(slot.audio, "audio") if slot.audio is not None else None
            memory.append({"image": str(image.path), "audio": str(audio.path) if audio else None})
            inputs[slot.field] = {
                "image": describe(image),
                "audio": describe(audio) if audio else None,
                **origin,
            }
        config["memory"] = memory + ([source_memory] if stitch is not None else [])
        if spec.guides:
            config["guides"] = self._accept_guides(spec, caps, config["memory"], inputs)
        config["lineage"] = lineage(inputs, spec.lora)
        # After the device run: the extension stitched onto its source (the film has its own
        # stills), or the shot's stills; on a media worker either way.
        then = [stitch_step(stitch) if stitch is not None else stills_step(spec.work_id, spec.shot_id)]

        new = NewJob(
            kind="r2v",
            work_id=spec.work_id,
            shot_id=spec.shot_id,
            job_id=spec.job_id,
            payload_hash=digest,
            callback_url=spec.callback_url,
            callback_context=spec.callback_context,
            request={
                "client": without_inline_data(spec.client),
                "inputs": inputs,
                "job_name": R2V_JOB,
                "run_config": run_config(**{SHOT_OP: ShotConfig.model_validate(config)}),
                "then": [step.as_json() for step in then],
                **({"extension": {"before_frames": before_frames}} if stitch is not None else {}),
            },
            dialect=spec.dialect,
            submitter=spec.submitter,
            version_id=spec.version_id,
        )
        return self._accept(new)

    def check_capabilities(self, spec: ShotSpec, caps: Capabilities) -> None:
        """What the model cannot do is refused now, naming the client's field (:class:`RuleBook`)."""
        self.rules.check(spec, caps)

    def _accept_guides(
        self,
        spec: ShotSpec,
        caps: Capabilities | None,
        memory: list[dict[str, Any]],
        inputs: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """Each guide's file decoded and stored like any input (kind video: an image, else a video;
        kind audio: a sound), measured (a video's frames, whether it has a sound), then the whole
        request checked again with them and the memory as the run will have it: a video that does
        not fit in the clip from its frame, or a second audio track, is refused now. Answers the
        guides of the run config (and records each in ``inputs``)."""
        from shotloom.guides import measure

        guides, config = [], []
        for ref in spec.guides:
            asset = self._guide_asset(ref)
            # A guide video's sound goes in where the model takes sounds, unless the client said not.
            with_audio = (
                ref.kind == "video" and not spec.guide_no_audio and (caps is None or caps.audio_guides)
            )
            try:
                guide = measure(Guide(asset.path, ref.frame, ref.kind, with_audio), ref.field)
            except CapabilityError as exc:
                raise InvalidField(exc.message, ref.field) from None
            guides.append(guide)
            placed = {"frame": guide.frame, "kind": guide.kind, "with_audio": guide.with_audio}
            config.append({"path": str(asset.path), **placed})
            inputs[ref.field] = {**describe(asset), **placed}
        if caps is not None:
            self.rules.check_with_inputs(spec, caps, memory, tuple(guides))
        return config

    def _guide_asset(self, ref: GuideRef) -> InputAsset:
        """A guide's file stored content-addressed: a sound for kind audio; an image, else a video,
        for kind video (one whose size cannot make a frame is refused as such)."""
        if ref.kind == "audio":
            return self.resolve(ref.file, "audio")
        try:
            return self.resolve(ref.file, "image")
        except InvalidField as not_image:
            if not_image.code == MEDIA_SIZE:
                raise
            try:
                return self.resolve(ref.file, "video")
            except InvalidField as not_video:
                if not_video.code == MEDIA_SIZE:
                    raise
                raise InvalidField(
                    f"neither an image ({not_image.message}) nor a video ({not_video.message})", ref.field
                ) from None

    def _source_video(self, source: SourceRef) -> tuple[InputAsset, dict[str, Any]]:
        """The source of a video-to-video shot, stored content-addressed like any input (a
        version's MP4 is copied: the job never depends on that version's files staying)."""
        if source.video is not None:
            asset = self.resolve(source.video, "video")
            return asset, describe(asset)
        job = self.store.get(source.version_id or "")
        if job is None or job.kind != "r2v":
            raise Conflict(f"unknown r2v version {source.version_id!r}", source.field)
        if job.status != "succeeded":
            raise Conflict(f"version {job.version_id} has not succeeded (status {job.status})", source.field)
        video = self.video_path(job.version_id)
        if video is None:
            raise Conflict(f"the video of version {job.version_id} is no longer available", source.field)
        asset = self.resolve(InputRef(source.field, upload=video), "video")
        return asset, {**describe(asset), "version_id": job.version_id, "shot_id": job.shot_id}

    def _extension(
        self, spec: ShotSpec, caps: Capabilities | None, config: dict[str, Any], inputs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], int]:
        """An extension's first frame (its source's last, into ``config``); answers the stitching
        merge's config (the source goes before the new shot), the memory slot of the source and
        the source's frame count."""
        source = spec.extends
        assert source is not None
        if spec.first_frame is not None:
            raise InvalidField(
                "an extension starts at its source's last frame: leave the first frame out",
                spec.first_frame.field,
            )
        asset, described = self._source_video(source)
        frames, audio, video_frames = self._reference(
            asset.path,
            ["middle", "last"],
            caps is None or caps.audio_in,
            source.field,
            spec.submitter,
            kept_by=self._version_video(described),
        )
        image, first = frames["middle"], frames["last"]
        config["first_frame"] = str(first.path)
        inputs[source.field] = {
            **described,
            "last_frame": describe(first),
            "memory": {"image": describe(image), "audio": describe(audio) if audio else None},
        }
        before = described.get("shot_id") or f"upload:{asset.sha256[:12]}"
        stitch = {
            "work_id": spec.work_id,
            "inputs": [str(asset.path)],
            "shot_ids": [before],
            "versions": [described.get("version_id") or f"sha256:{asset.sha256}"],
        }
        memory = {"image": str(image.path), "audio": str(audio.path) if audio else None}
        return stitch, memory, video_frames

    def _character_memory(self, slot: MemoryRef, with_audio: bool) -> tuple[InputAsset, InputAsset | None]:
        character = self.store.get_character(slot.character_id or "")
        if character is None:
            raise InvalidField(f"unknown character {slot.character_id!r}", slot.field)

        def asset(rec: InputAssetRecord, role: Role) -> InputAsset:
            return InputAsset(
                rec.sha256, self.assets_dir / rec.path, rec.path, rec.media_type, rec.bytes, role, "file"
            )

        audio = character.audio if with_audio else None
        return asset(character.image, "image"), asset(audio, "audio") if audio is not None else None

    def create_character(self, name: str, source: SourceRef, submitter: str | None) -> CharacterRecord:
        """A named reference taken once from a video (a finished version or a resource): its
        representative frame and its audio track, stored content-addressed. The same name and
        media give the same id."""
        asset, described = self._source_video(source)
        frames, audio, _ = self._reference(
            asset.path, ["middle"], True, source.field, submitter, kept_by=self._version_video(described)
        )
        image = frames["middle"]
        key = "\0".join([name, image.sha256, audio.sha256 if audio else ""])
        character_id = "char_" + hashlib.sha256(key.encode()).hexdigest()[:32]
        origin = (
            {"version_id": described["version_id"]} if "version_id" in described else {"sha256": asset.sha256}
        )
        return self.store.put_character(
            character_id, name, image.sha256, audio.sha256 if audio else None, origin, submitter
        )

    def _shot_memory(
        self, work_id: str, shot_id: str, field: str, with_audio: bool = True
    ) -> tuple[InputAsset, InputAsset | None, str]:
        """A bare memory ``shot_id``: the newest successful shot of the same work, as memory (and
        the version it came from)."""
        job = self.store.newest_succeeded_shot(work_id, shot_id)
        video = self.video_path(job.version_id) if job is not None else None
        if job is None or video is None:
            raise Conflict(f"no successful shot {shot_id!r} in work {work_id!r} to take memory from", field)
        # A representative frame and the complete audio track (the audio only where the model takes it).
        frames, audio, _ = self._reference(video, ["middle"], with_audio, field, None, kept_by=video)
        return frames["middle"], audio, job.version_id

    def _version_video(self, described: dict[str, Any]) -> Path | None:
        """The MP4 of the version a source came from (None for an upload)."""
        return self.video_path(described["version_id"]) if "version_id" in described else None

    def _reference(
        self,
        video: Path,
        frames: list[str],
        with_audio: bool,
        field: str,
        submitter: str | None,
        kept_by: Path | None = None,
    ) -> tuple[dict[str, InputAsset], InputAsset | None, int]:
        """Frames (middle, last) and the sound of a video, stored like client inputs; and the
        video's frame count. A shot of ours (``kept_by``, its MP4) kept them when its stills were
        made; anything else is taken by a run on a media worker."""
        taken = kept_reference(self.media, kept_by, frames, with_audio) if kept_by is not None else None
        if taken is None:
            try:
                taken = self.references.reference(video, frames, with_audio, submitter)
            except ValueError as exc:
                raise InvalidField(f"cannot take frames from the video: {exc}", field) from None
        try:
            images = {
                name: copy_into_assets(
                    path, "image", self.api.inputs, self.assets_dir, self.store, field=field
                )
                for name, path in taken.frames.items()
            }
            audio = None
            if taken.audio is not None:
                audio = copy_into_assets(
                    taken.audio, "audio", self.api.inputs, self.assets_dir, self.store, field=field
                )
        except InputError as exc:  # checked like a client's (its video passed, so they rarely fail)
            raise InvalidField(exc.message, exc.field, code=exc.code) from None
        finally:
            taken.release()
        return images, audio, taken.video_frames

    def accept_merge(self, spec: MergeSpec) -> Accepted:
        digest = payload_hash(spec.idempotency_payload)
        replay = self.replay(spec.job_id, "merge", digest)
        if replay is not None:
            return Accepted(replay, False)
        check_path_part(spec.work_id, "work_id")  # the film's folder
        self.check_queue("merge")

        paths, shot_ids, sources, versions = [], [], [], []
        for shot in spec.shots:
            if shot.version_id is not None:
                job = self.store.get(shot.version_id)
                if job is None or job.kind != "r2v":
                    raise Conflict(f"unknown r2v version {shot.version_id!r}", shot.field)
                if job.status != "succeeded":
                    raise Conflict(
                        f"version {job.version_id} has not succeeded (status {job.status})", shot.field
                    )
                video = self.video_path(job.version_id)
                if video is None:
                    raise Conflict(
                        f"the video of version {job.version_id} is no longer available", shot.field
                    )
                paths.append(self.media.relative(video))
                shot_ids.append(job.shot_id or job.version_id)
                versions.append(job.version_id)
                sources.append({"version_id": job.version_id})
            else:
                assert shot.video is not None
                asset = self.resolve(shot.video, "video")
                paths.append(str(asset.path))
                shot_ids.append(f"url:{asset.sha256[:12]}")
                versions.append(f"sha256:{asset.sha256}")  # not a version of ours: its content
                sources.append({"video_url": shot.video.value, "sha256": asset.sha256})
        config = {"work_id": spec.work_id, "inputs": paths, "shot_ids": shot_ids, "versions": versions}
        new = NewJob(
            kind="merge",
            work_id=spec.work_id,
            job_id=spec.job_id,
            payload_hash=digest,
            callback_url=spec.callback_url,
            callback_context=spec.callback_context,
            request={
                "client": spec.client,
                "inputs": {"shots": sources},
                "job_name": MERGE_JOB,
                "run_config": run_config(**{MERGE_OP: MergeConfig.model_validate(config)}),
            },
            dialect=spec.dialect,
            submitter=spec.submitter,
        )
        return self._accept(new)

    def rerender(
        self,
        works: list[str] | None,
        shots: list[str] | None,
        seed: str,
        priority: int,
        reason: str,
        key: str,
        submitter: str,
        match: dict[str, str] | None = None,
    ) -> list[Accepted]:
        """A new version of every matching shot (its newest success), from the same request and
        inputs: the seed kept or drawn anew, below interactive work in the queue, one idempotency
        key per shot and ``key`` (a trigger repeated with its key queues nothing twice). ``match``
        filters by the tags of the shot's runs: ``shotloom/kind`` (r2v, v1) and ``user``."""
        out = []
        wanted = match or {}
        for job in self.store.latest_shots(works, shots):
            tags = {KIND_TAG: run_kind(job), USER_TAG: job.submitter or "api"}
            if any(tags.get(k) != v for k, v in wanted.items()):
                continue
            request = job.request.as_json()  # the new row's, from the stored one
            config = request["run_config"]["ops"][SHOT_OP]["config"]
            if seed == "new":
                config["seed"] = secrets.randbelow(2**32)
            elif config.get("seed") is None and job.result and job.result.seed is not None:
                config["seed"] = job.result.seed  # unseeded: keep the one the worker drew
            self._renew_shot_memory(job, request, config)
            made_from = config.setdefault("lineage", {"inputs": {}, "derived_from": []})
            made_from["derived_from"] = sorted({*made_from.get("derived_from", []), job.version_id})
            request["rerender"] = {"of": job.version_id, "reason": reason, "seed": seed}
            payload = {"kind": "rerender", "of": job.version_id, "seed": seed, "reason": reason}
            new = NewJob(
                kind="r2v",
                work_id=job.work_id,
                shot_id=job.shot_id,
                job_id=f"rerender:{key}:{job.work_id}:{job.shot_id}",
                payload_hash=payload_hash(payload),
                callback_url=job.callback_url,
                callback_context=job.callback_context,
                request=request,
                dialect=job.dialect,
                submitter=submitter,
                priority=priority,
            )
            self.check_queue("r2v")
            out.append(self._accept(new))
        return out

    def _renew_shot_memory(self, job: JobRecord, request: dict[str, Any], config: dict[str, Any]) -> None:
        """A re-render's ``shot_id`` memory slots take the newest successful version of that shot
        now, not the frame taken when the shot was first made (its other inputs stay as they were:
        content-addressed files). Memory slots are the inputs with an ``image``, in slot order."""
        caps = self.capabilities()
        slots = [name for name, value in request.get("inputs", {}).items() if "image" in value]
        for k, name in enumerate(slots):
            shot_id = request["inputs"][name].get("shot_id")
            if shot_id is None or k >= len(config.get("memory", [])):
                continue
            image, audio, version = self._shot_memory(
                job.work_id, shot_id, f"{name}.shot_id", caps is None or caps.audio_in
            )
            config["memory"][k] = {"image": str(image.path), "audio": str(audio.path) if audio else None}
            request["inputs"][name] = {
                "image": describe(image),
                "audio": describe(audio) if audio else None,
                "version_id": version,
                "shot_id": shot_id,
            }
        kept = {k: v for k, v in config.get("lineage", {}).items() if k not in ("inputs", "derived_from")}
        config["lineage"] = {**lineage(request.get("inputs", {}), config.get("lora")), **kept}


def lineage(inputs: dict[str, Any], lora: str | None) -> dict[str, Any]:
    """What a shot was made from, for its materialization and ``GET /version``: each input's
    content hash (and the earlier version or character it came from), the versions it derives
    from, the adapter."""
    flat: dict[str, Any] = {}
    for name, value in inputs.items():
        if "sha256" in value:  # one file
            flat[name] = {k: value[k] for k in ("sha256", "version_id", "shot_id") if k in value}
        else:  # an image with its audio, and where they came from
            flat[name] = {
                "sha256": value["image"]["sha256"],
                **({"audio_sha256": value["audio"]["sha256"]} if value.get("audio") else {}),
                **{k: value[k] for k in ("version_id", "shot_id", "character_id") if k in value},
            }
    derived = sorted({v["version_id"] for v in flat.values() if v.get("version_id")})
    out: dict[str, Any] = {"inputs": flat, "derived_from": derived}
    if lora is not None:  # no nulls: Dagster's config maps refuse them
        out["adapter"] = lora
    return out


def describe(asset: InputAsset) -> dict[str, Any]:
    """What a client may see of a stored input: never its local path."""
    out = {
        "sha256": asset.sha256,
        "media_type": asset.media_type,
        "bytes": asset.bytes,
        "source": asset.source,
    }
    if asset.width:
        out.update(width=asset.width, height=asset.height)
    return out


def without_inline_data(value: Any) -> Any:
    """The request as stored and shown back: data: URLs shortened (they can be MBs)."""
    if isinstance(value, str) and value.startswith("data:"):
        return value.split(",", 1)[0] + ",..."
    if isinstance(value, dict):
        return {k: without_inline_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_inline_data(v) for v in value]
    return value
