"""`contentsvc gc`: one collection pass (projectors/gc.py), and what it removed."""

from __future__ import annotations

import asyncio

import psycopg

from contentsvc.config import Settings
from contentsvc.projectors.gc import Collected, Collector


async def _collect(url: str, settings: Settings, dry_run: bool) -> Collected:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                     application_name="contentsvc gc") as conn:
        return await Collector.from_settings(settings).collect(conn, dry_run=dry_run)


def run_gc(url: str, settings: Settings, dry_run: bool = False) -> int:
    done = asyncio.run(_collect(url, settings, dry_run))
    verb = "would remove" if dry_run else "removed"
    for kind, generation_id, size in done.generations:
        print(f"{verb} generation {kind}/{generation_id} ({size} bytes)")
    for blob_id, size in done.blobs:
        print(f"{verb} blob {blob_id} ({size} bytes)")
    for upload_id, size in done.uploads:
        print(f"{verb} upload {upload_id}, received but never confirmed ({size} bytes)")
    for key, size in done.files:
        print(f"{verb} blob file {key} ({size} bytes)")
    print(f"{verb} {len(done.generations)} generation(s), {len(done.blobs)} blob(s),"
          f" {len(done.uploads)} unconfirmed upload(s), {len(done.files)} blob file(s): {done.bytes_freed} bytes {'to free' if dry_run else 'freed'}")
    return 0
