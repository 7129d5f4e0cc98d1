"""`contentsvc projector status` and `replay`: operator views of the folds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from contentsvc.journal import checkpoints
from contentsvc.journal.store import head as journal_head
from contentsvc.journal.store import read_after
from contentsvc.projectors.faults import Fault, faults_of
from contentsvc.projectors.runner import instance_lock_id
from contentsvc.search.generations import Generation, bytes_held


def head_position(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT coalesce(max(position), 0) FROM journal").fetchone()[0]


def checkpoints_by_name(conn: psycopg.Connection) -> dict[str, tuple]:
    """(position, updated_at) of every checkpoint, by name."""
    return {r[0]: r[1:] for r in conn.execute("SELECT name, position, updated_at FROM projector_checkpoints")}


def held_locks(conn: psycopg.Connection) -> set[int]:
    """The advisory locks granted in this database: a running projector or worker holds its
    single-instance lock (a 64-bit key: classid is its high half, objid its low half)."""
    return {r[0] for r in conn.execute(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l"
        " JOIN pg_database d ON d.oid = l.database AND d.datname = current_database()"
        " WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted")}


def print_faults(console: Console, faults: list[dict]) -> None:
    """The faults (projectors/faults.py), when any: each stops its fold until a step gets past it."""
    if not faults:
        return
    table = Table(title="faults (each retries where it stopped until a step gets past it; see its log)")
    for column in ("name", "at", "error", "attempts", "since", "last"):
        table.add_column(column)
    for f in faults:
        where = Fault(f["error"], f["message"], f["first_position"], f["last_position"], f["kind"]).where()
        table.add_row(f["name"], where or "-", f"{f['error']}: {f['message']}", str(f["attempts"]),
                      f["first_failed_at"], f["last_failed_at"])
    console.print(table)


def projector_status(url: str, names: list[str], home: Path) -> dict:
    """What `projector status` shows, as one JSON-ready object."""
    with psycopg.connect(url) as conn:
        head = head_position(conn)
        rows = checkpoints_by_name(conn)
        faults = faults_of(conn, names)
        found = [Generation(*r) for r in conn.execute(
            "SELECT generation_id, kind, state, announced FROM search_generations ORDER BY kind, created_at")]
        held = held_locks(conn)
        building = conn.execute(
            "SELECT org_id, corpus_id, projection_generation_id, operation_id, versions_done, versions_in_scope"
            " FROM corpus_projections WHERE state = 'building' ORDER BY accepted_position").fetchall()
    # A retired generation is listed while its files remain (until `contentsvc gc` deletes them).
    shown = [g for g in found if g.state != "retired" or g.path(home).is_dir()]
    projectors = []
    for name in names:
        # Index projectors keep one checkpoint per generation.
        for generation in [g for g in shown if g.kind == name] or [None]:
            position, updated = rows.get(generation.checkpoint_name if generation else name, (0, None))
            projectors.append({
                "name": name, "running": instance_lock_id(name) in held,
                "generation": {"generation_id": generation.generation_id, "state": generation.state,
                               "bytes": bytes_held(generation.path(home))} if generation else None,
                "position": position, "lag": head - position,
                "updated_at": updated.isoformat() if updated else None})
    return {"journal_head": head, "projectors": projectors, "faults": faults,
            "building": [dict(zip(("org_id", "corpus_id", "generation_id", "operation_id", "versions_done",
                                   "versions_in_scope"), row)) for row in building]}


def print_status(url: str, names: list[str], home: Path, as_json: bool = False) -> int:
    status = projector_status(url, names, home)
    if as_json:
        print(json.dumps(status))
        return 0
    table = Table(title=f"journal head {status['journal_head']}")
    for column in ("projector", "running", "generation", "position", "lag (events)", "bytes", "updated"):
        table.add_column(column)
    for p in status["projectors"]:
        generation = p["generation"]
        table.add_row(p["name"], "yes" if p["running"] else "no",
                      f"{generation['generation_id']} ({generation['state']})" if generation else "-",
                      str(p["position"]), str(p["lag"]), str(generation["bytes"]) if generation else "-",
                      p["updated_at"] or "never")
    console = Console(width=max(Console().width, 140))  # a generation id and its state stay on one line
    console.print(table)
    print_faults(console, status["faults"])
    if status["building"]:
        table = Table(title="corpus projection generations being built")
        for column in ("corpus", "generation", "operation", "versions done", "in scope"):
            table.add_column(column)
        for b in status["building"]:
            table.add_row(f"{b['org_id']}/{b['corpus_id']}", b["generation_id"], b["operation_id"],
                          str(b["versions_done"]), str(b["versions_in_scope"]))
        console.print(table)
    return 0


READ_TABLES = ("corpora", "receipts", "records", "versions", "uploads", "blobs", "operations",
               "saved_queries", "saved_query_versions", "subscriptions", "subscription_versions")


async def _replay_readmodel(url: str, projector) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with conn.transaction():
            # Holding the checkpoint row stops the running projector; readers keep
            # the old rows (DELETE, not TRUNCATE) until this commits.
            await checkpoints.ensure(conn, projector.name)
            await checkpoints.position(conn, projector.name, for_update=True)
            head = await journal_head(conn)
            for table in READ_TABLES:
                await conn.execute(f"DELETE FROM {table}")
            position = 0
            with Progress() as progress:
                task = progress.add_task(f"replaying {projector.name}", total=head)
                while position < head:
                    events = [e for e in await read_after(conn, position, 2000) if e.position <= head]
                    if not events:
                        break
                    await projector.apply(conn, events)
                    position = events[-1].position
                    progress.update(task, completed=position)
            await checkpoints.reset(conn, projector.name, position)


async def _rebuild_corpus(url: str, corpus_id: str, org_id: str | None) -> int:
    """A rebuild Operation accepted on the operator's behalf, followed to its end."""
    from contentsvc.auth.principal import Principal
    from contentsvc.commands.operations import rebuild_corpus
    from contentsvc.domain.models import KeyedActionRequest
    from contentsvc.ids import new_id

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT org_id FROM corpora WHERE corpus_id = %s AND (%s::text IS NULL OR org_id = %s)",
                                 (corpus_id, org_id, org_id))
        orgs = [r[0] for r in await cur.fetchall()]
        if len(orgs) != 1:
            print(f"corpus {corpus_id!r} " + ("not found" if not orgs else "exists in several Organizations; add --org"))
            return 2
        operator = Principal(key_id="operator", org_id=orgs[0], actions=frozenset(), corpora=None)
        operation_id, _ = await rebuild_corpus(conn, operator, corpus_id,
                                               KeyedActionRequest(idempotency_key=new_id("operator")))
        print(f"rebuild {operation_id} accepted for corpus {corpus_id}; the lexical projector builds it")
        with Progress() as progress:
            task = progress.add_task(f"rebuilding {corpus_id}", total=None)
            while True:
                doc = (await (await conn.execute("SELECT doc FROM operations WHERE operation_id = %s",
                                                 (operation_id,))).fetchone())[0]
                counters = doc["counters"]
                progress.update(task, total=max(counters["versions_in_scope"], 1), completed=counters["versions_done"])
                if doc["state"] in ("succeeded", "failed", "canceled"):
                    break
                await asyncio.sleep(0.5)
    print(f"{operation_id}: {doc['state']}" + (f", serving {doc['result']['projection_generation_id']}"
                                               if doc.get("result") else f" {doc.get('errors')}"))
    return 0 if doc["state"] == "succeeded" else 1


def replay(url: str, projector, corpus_id: str | None = None, org_id: str | None = None) -> int:
    if corpus_id is not None:
        if projector.name not in ("lexical", "vectors"):
            print("--corpus rebuilds one Corpus's projection generation: use it with `replay lexical|vectors`")
            return 2
        # A Corpus's projection generation holds its lexical documents and names its vector spaces
        # (a rebuild adds those enabled since; their vectors are embedded after the cutover).
        return asyncio.run(_rebuild_corpus(url, corpus_id, org_id))
    if projector.name == "readmodel":
        asyncio.run(_replay_readmodel(url, projector))
        print("replayed readmodel from position 0")
        return 0
    if projector.name == "lexical":
        from contentsvc.operator.replay import replay_lexical

        generation = asyncio.run(replay_lexical(url, projector.home))
        print(f"lexical generation {generation} built from position 0 and now serving")
        return 0
    if projector.name == "vectors":
        from contentsvc.operator.replay import replay_vectors

        generation = asyncio.run(replay_vectors(url, projector.home))
        print(f"vector generation {generation} built from the stored vectors and now serving")
        return 0
    print(f"{projector.name} appends facts to the journal; it is never replayed (its output is history).")
    return 2
