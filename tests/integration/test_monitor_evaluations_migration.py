"""schema/031 on a deployment that already has evaluations: the ended ones leave
`monitor_evaluations`, the pending ones stay, and the trigger mark covers every trigger folded
before it (docs/decisions.md "Evaluation and Matches")."""

from __future__ import annotations

import psycopg
import pytest

from contentsvc.processes.local_service import create_database, drop_database
from contentsvc.storage.migrations import migrate, schema_dir

MIGRATION = "031_monitor_pending_evaluations_only.sql"


@pytest.fixture
def database_before_031(admin_url):
    url = create_database(admin_url, "cstest")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE schema_migrations (name text PRIMARY KEY,"
                         " applied_at timestamptz NOT NULL DEFAULT now())")
            for path in sorted(schema_dir().glob("*.sql")):
                if path.name >= MIGRATION:
                    break
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
        yield url
    finally:
        drop_database(admin_url, url)


def _evaluation(conn, sv: str, v: str, state: str, trigger_position: int) -> None:
    conn.execute("INSERT INTO monitor_evaluations (subscription_version_id, version_id, subscription_id, org_id,"
                 " corpus_id, record_id, trigger_position, state, next_attempt_at)"
                 " VALUES (%s, %s, 'sub_1', 'org', 'c', 'rec_1', %s, %s, now())", (sv, v, trigger_position, state))


@pytest.mark.parametrize("checkpoint, mark", [(None, 12), (7, 12), (40, 40)])
def test_ended_evaluations_leave_and_the_mark_covers_what_was_folded(database_before_031, checkpoint, mark):
    with psycopg.connect(database_before_031, autocommit=True) as conn:
        _evaluation(conn, "sv_1", "v_1", "decided", 5)
        _evaluation(conn, "sv_1", "v_2", "failed", 9)
        _evaluation(conn, "sv_1", "v_3", "dropped", 12)
        _evaluation(conn, "sv_1", "v_4", "pending", 11)
        if checkpoint is not None:
            conn.execute("INSERT INTO projector_checkpoints (name, position) VALUES ('monitor', %s)", (checkpoint,))
    assert migrate(database_before_031)[0] == MIGRATION  # then those after it
    with psycopg.connect(database_before_031, autocommit=True) as conn:
        assert conn.execute("SELECT version_id FROM monitor_evaluations").fetchall() == [("v_4",)]
        # the highest trigger folded, whether a row or the monitor's checkpoint says so
        assert conn.execute("SELECT position FROM monitor_trigger_mark").fetchall() == [(mark,)]
        with pytest.raises(psycopg.errors.UniqueViolation):  # one mark, never two
            conn.execute("INSERT INTO monitor_trigger_mark (position) VALUES (1)")
