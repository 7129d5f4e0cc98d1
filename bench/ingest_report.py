"""The ingest suite's report: its targets judged, what went wrong in words, and the
summary printed at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contentsvc.bench.driver import target_lines, closing_lines, fmt, judge, machine_line
from contentsvc.bench.ingest_batch import BATCH_CONCURRENCY
from contentsvc.bench.ingest_single import SINGLE_CONCURRENCY
from contentsvc.bench.journal_raw import RAW_CONCURRENCY
from contentsvc.bench.process_cpu import busiest

# Batch and single ingest as the README's table of benchmarks states them, and the
# 202-to-resolved median.
TARGETS = {
    "batch_records_per_s": {"op": ">=", "value": 10000, "unit": "records/s"},
    "single_req_per_s": {"op": ">=", "value": 1000, "unit": "req/s"},
    "single_p99_ms": {"op": "<=", "value": 30, "unit": "ms"},
    "resolve_p50_ms": {"op": "<=", "value": 300, "unit": "ms"},
}


def judge_targets(results: dict[str, Any]) -> dict[str, Any]:
    return judge(TARGETS, {
        "batch_records_per_s": results.get("batch", {}).get("records_per_s"),
        "single_req_per_s": results.get("single", {}).get("median_throughput_req_per_s"),
        "single_p99_ms": results.get("single", {}).get("median_p99_ms"),
        "resolve_p50_ms": results.get("resolve", {}).get("from_202", {}).get("p50_ms"),
    })


def problems(report: dict[str, Any]) -> list[str]:
    """What went wrong or looked wrong in this run, in words (the figures are in results)."""
    res, out = report["results"], []
    for name in ("single", "batch", "resolve", "single_folds_paused", "batch_folds_paused"):
        ph = res.get(name, {})
        errs = ph.get("errors", {})
        if errs.get("total"):
            out.append(f"{name}: {errs['total']} failed requests {errs['by_kind']}")
        if ph.get("item_errors", {}).get("total"):
            out.append(f"{name}: {ph['item_errors']['total']} batch items not accepted {ph['item_errors']['by_kind']}")
        if ph.get("capped_at_s"):
            out.append(f"{name}: stopped at the {ph['capped_at_s']:.0f} s cap before sending everything")
        drain = ph.get("drain_after_phase") or {}
        if drain.get("unresolved"):
            out.append(f"{name}: {drain['unresolved']}/{drain['checked']} sampled receipts still pending "
                       f"{drain['seconds']:.0f} s after the phase")
    lat = res.get("resolve", {})
    if lat.get("unresolved_after_60s"):
        out.append(f"resolve: {lat['unresolved_after_60s']} receipts without a receipt.resolved event after 60 s")
    if lat.get("feed_failure"):
        out.append(f"resolve: change stream failed: {lat['feed_failure']}")
    pending_after = (lat.get("get_receipt_right_after_resolved_event") or {}).get("pending")
    if pending_after:
        out.append(f"resolve: getReceipt still said pending for {pending_after} receipts read right after their "
                   "receipt.resolved event arrived (the feed announces before the read model shows it)")
    lag = lat.get("stream_delivery_lag") or {}
    if (lag.get("max_ms") or 0) > 1000:
        out.append(f"resolve: a change event reached the stream {lag['max_ms'] / 1000:.1f} s after its commit")
    integ = res.get("integrity", {})
    if integ.get("not_resolved"):
        out.append(f"integrity: {integ['not_resolved']} of {integ['receipts']} receipts never resolved")
    raw = res.get("raw_journal", {})
    for key, m in raw.items():
        if isinstance(m, dict) and m.get("errors", {}).get("total"):
            out.append(f"raw {key}: {m['errors']['total']} failed transactions {m['errors']['by_kind']}")
    log = report.get("server_log") or {}
    bad = {k: v for k, v in (log.get("by_level") or {}).items() if k not in ("info", "debug")}
    if bad:
        out.append(f"server log: {bad} (see {log['path']})")
    return out


def summary_text(report: dict[str, Any], result_path: Path) -> str:
    res = report["results"]
    s, b, lat, raw = res["single"], res["batch"], res["resolve"], res["raw_journal"]
    rows: list[tuple[str, str, str]] = []
    rows.append(("single ingest  c=16", f"{fmt(s['throughput_req_per_s'])} req/s",
                 f"p50 {fmt(s['latency']['p50_ms'])}  p95 {fmt(s['latency']['p95_ms'])}  "
                 f"p99 {fmt(s['latency']['p99_ms'])} ms   ok {s['accepted_202']}/{s['requests_sent']}  "
                 f"errors {s['errors']['total']}"))
    if len(s["runs"]) > 1:
        rows.append((f"  {len(s['runs'])} runs, judged", f"{fmt(s['median_throughput_req_per_s'])} req/s",
                     f"p99 {fmt(s['median_p99_ms'])} ms: the medians of "
                     + ", ".join(f"{fmt(r['throughput_req_per_s'])} req/s p99 {fmt(r['p99_ms'])}" for r in s["runs"])
                     + f"; the figures above are run {s['median_run'] + 1}'s"))
    rows.append(("  resolved after", f"{fmt(s['drain_after_phase']['seconds'])} s",
                 f"projector drain after singles (unresolved {s['drain_after_phase']['unresolved']}"
                 f"/{s['drain_after_phase']['checked']} checked; searchable after "
                 f"{fmt(s['drain_after_phase'].get('searchable_seconds'))} s)"))
    paused = res.get("single_folds_paused")
    if paused:
        rows.append(("  folds paused (ref.)", f"{fmt(paused['throughput_req_per_s'])} req/s",
                     f"p50 {fmt(paused['latency']['p50_ms'])}  p99 {fmt(paused['latency']['p99_ms'])} ms   the same "
                     f"requests with the {paused['folds_paused']} projectors and workers stopped"))
    rows.append(("batch x100     c=4", f"{fmt(b['records_per_s'])} rec/s",
                 f"batch p50 {fmt(b['batch_latency']['p50_ms'])}  p99 {fmt(b['batch_latency']['p99_ms'])} ms   "
                 f"ok {b['records_accepted_202']} rec  errors {b['errors']['total']}+{b['item_errors']['total']} items"))
    rows.append(("  accepted+resolved", f"{fmt(b['records_resolved_per_s_end_to_end'])} rec/s",
                 f"projector drain after batches {fmt(b['drain_after_phase']['seconds'])} s "
                 f"(unresolved {b['drain_after_phase']['unresolved']}/{b['drain_after_phase']['checked']} checked; "
                 f"searchable after {fmt(b['drain_after_phase'].get('searchable_seconds'))} s)"))
    paused = res.get("batch_folds_paused")
    if paused:
        rows.append(("  folds paused (ref.)", f"{fmt(paused['records_per_s'])} rec/s",
                     f"the same batches with the {paused['folds_paused']} projectors and workers stopped: "
                     f"the API and PostgreSQL alone on the cores"))
    rows.append((f"202->resolved  {fmt(lat['rate_per_s'])}/s", f"p50 {fmt(lat['from_202']['p50_ms'])} ms",
                 f"p99 {fmt(lat['from_202']['p99_ms'])} ms  (from send: p50 {fmt(lat['from_send']['p50_ms'])} "
                 f"p99 {fmt(lat['from_send']['p99_ms'])})  seen {lat['resolved_seen']}/{lat['accepted_202']}  "
                 f"errors {lat['errors']['total']}  via {lat['mode'].split(' ')[0]}"))
    srv = lat.get("journal_accepted_to_resolved")
    if srv:
        rows.append(("  in the journal", f"p50 {fmt(srv['p50_ms'])} ms",
                     f"p99 {fmt(srv['p99_ms'])} ms  max {fmt(srv['max_ms'])} ms  (ingest.accepted -> receipt.resolved "
                     f"committed_at)"))
    lag = lat.get("stream_delivery_lag")
    if lag:
        rows.append(("  stream delivery lag", f"p50 {fmt(lag['p50_ms'])} ms",
                     f"p99 {fmt(lag['p99_ms'])} ms  max {fmt(lag['max_ms'])} ms  over {lag['count']} change events "
                     f"(arrival - committed_at)"))
    after = lat.get("get_receipt_right_after_resolved_event") or {}
    if after:
        rows.append(("  getReceipt after event", f"{after.get('pending', 0)} pending",
                     f"of {sum(after.values())} read right after their receipt.resolved event arrived"))
    integ = res.get("integrity", {})
    if "receipts" in integ:
        rows.append(("all receipts", f"{integ['not_resolved']} pending",
                     f"of {integ['receipts']} accepted in this run (after waiting {integ['waited_s']} s)"))
    if "skipped" in raw:
        rows.append(("raw journal", "skipped", raw["skipped"]))
    else:
        for key, label in (("journal_1conn", "journal append 1/txn c=1"), ("plain_1conn", "plain INSERT   1/txn c=1"),
                           (f"journal_{RAW_CONCURRENCY}conn", f"journal append 1/txn c={RAW_CONCURRENCY}"),
                           (f"plain_{RAW_CONCURRENCY}conn", f"plain INSERT   1/txn c={RAW_CONCURRENCY}"),
                           ("journal_batch100_1conn", "journal append 100/call c=1"),
                           (f"plain_{SINGLE_CONCURRENCY}conn", f"plain INSERT   1/txn c={SINGLE_CONCURRENCY}"),
                           (f"plain_batch100_{BATCH_CONCURRENCY}conn", f"plain INSERT 100/txn c={BATCH_CONCURRENCY}")):
            m = raw[key]
            rows.append((label, f"{fmt(m['events_per_s'])} ev/s",
                         f"txn p50 {fmt(m['transaction_latency']['p50_ms'])}  p99 "
                         f"{fmt(m['transaction_latency']['p99_ms'])} ms  errors {m['errors']['total']}"))
        rows.append(("journal/plain", f"c=1 {fmt(raw['ratio_journal_to_plain_1conn'])}",
                     f"c={RAW_CONCURRENCY} {fmt(raw[f'ratio_journal_to_plain_{RAW_CONCURRENCY}conn'])}   "
                     f"(fsync={raw['postgres']['fsync']}, synchronous_commit={raw['postgres']['synchronous_commit']})"))
        ceilings = res["ratios_to_ceilings"]
        rows.append(("ingest/ceiling", f"single {ceilings['single_to_plain_commits']}",
                     f"batch {ceilings['batch_to_plain_100_row_transactions']}   (each phase's rate over the "
                     f"plain INSERT at its concurrency, above)"))
        if "single_to_single_folds_paused" in ceilings:
            rows.append(("single/folds paused", f"{ceilings['single_to_single_folds_paused']}",
                         f"folds paused over plain {ceilings['single_folds_paused_to_plain_commits']}"))
        if "batch_to_batch_folds_paused" in ceilings:
            rows.append(("batch/folds paused", f"{ceilings['batch_to_batch_folds_paused']}",
                         f"folds paused over plain {ceilings['batch_folds_paused_to_plain_100_row_transactions']}"))
    for phase in ("single", "batch", "resolve", "single_folds_paused", "batch_folds_paused"):
        cpu = res.get(phase, {}).get("cpu_s")
        if cpu:
            rows.append((f"cpu s {phase}", f"{fmt(cpu['total'])} s", busiest(cpu)))
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    lines = ["", f"contentsvc bench ingest  {report['timestamp']}  {machine_line(report['machine'])}",
             "-" * (w1 + w2 + 70)]
    lines += [f"{a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in rows]
    lines.append("-" * (w1 + w2 + 70))
    lines += target_lines(report)
    for line in report.get("problems", []):
        lines.append(f"PROBLEM: {line}")
    return "\n".join(lines + closing_lines(report, result_path))
