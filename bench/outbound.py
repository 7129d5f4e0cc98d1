"""`contentsvc bench outbound`: what an outbound call costs the process that makes it.

Usage:
    contentsvc bench outbound [--requests 3000] [--concurrency 8] [--runs 3] [--clients 20]

No service: a loopback HTTP/1.1 server in a process of its own answers every POST with 200 at
once, and this process sends webhook-sized POSTs (about 700 bytes with the Standard Webhooks
headers) at --concurrency, on keep-alive connections, as the deliveries worker does. Three
clients, in alternating runs (--runs each): `outbound_http.outbound_pool` (httpcore's pool on
asyncio streams, what the deliveries worker sends through), `outbound_http.outbound_client`
(httpx on that pool, what plugin calls use) and a plain `httpx.AsyncClient` (httpcore on anyio,
the reference). Each run gives this process's CPU per request (the server's is not counted) and
requests per second.
Then the CPU of making one client, --clients times each: a plain httpx client loads the CA
bundle every time, outbound_client once per process (docs/decisions.md, "Outbound HTTP").

No targets: the figures say what the service's choice buys on this machine. They go to
bench/results/outbound.json; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import signal
import statistics
import sys
import time
from contextlib import asynccontextmanager
from typing import Any

import httpcore
import httpx

from contentsvc.bench.driver import RESULTS_DIR, Run, closing_lines, machine_line, write_results
from contentsvc.outbound_http import outbound_client, outbound_pool, pool_headers

RESULT_PATH = RESULTS_DIR / "outbound.json"
BODY = b'{"type":"match.created","timestamp":"2026-01-01T00:00:00Z","data":{"match_id":"' + b"m" * 600 + b'"}}'
HEADERS = {"content-type": "application/json", "webhook-id": "msg_bench", "webhook-timestamp": "1767225600",
           "webhook-signature": "v1," + "A" * 44}
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
WARM_UP = 200


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request with a Content-Length body (or none), as a loopback receiver reads it;
    its body. IncompleteReadError once the client has closed the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return await reader.readexactly(length)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await read_request(reader)
            writer.write(ANSWER)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _serve(port_out) -> None:
    """The receiver's process: answers until it is terminated. SIGTERM ends it at once: the handler
    inherited from the bench (SystemExit) fired inside its event loop's callbacks and logged them
    as errors."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    async def serve() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@asynccontextmanager
async def _httpx_poster(client: httpx.AsyncClient, url: str):
    """post() -> status: a POST to `url` through an httpx client, its whole answer read."""
    async with client:
        async def post() -> int:
            async with client.stream("POST", url, content=BODY, headers=HEADERS) as response:
                async for _ in response.aiter_bytes():
                    pass
                return response.status_code
        yield post


@asynccontextmanager
async def _pool_poster(pool: httpcore.AsyncConnectionPool, url: str):
    """post() -> status: a POST to `url` through the connection pool alone, as the deliveries worker sends."""
    async with pool:
        async def post() -> int:
            headers = pool_headers(url.split("/")[2].encode(), BODY, HEADERS)  # per POST, as the worker signs
            async with pool.stream(b"POST", url, content=BODY, headers=headers) as response:
                async for _ in response.aiter_stream():
                    pass
                return response.status
        yield post


async def _one_run(make_client, url: str, requests: int, concurrency: int) -> dict[str, float]:
    client = make_client()
    async with POSTERS[type(client)](client, url) as send:
        gate = asyncio.Semaphore(concurrency)

        async def post() -> None:
            async with gate:
                if (status := await send()) != 200:
                    raise RuntimeError(f"the receiver answered {status}")

        await asyncio.gather(*(post() for _ in range(WARM_UP)))
        cpu, started = _cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(post() for _ in range(requests)))
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    return {"cpu_ms_per_request": round(cpu / requests * 1000, 3), "requests_per_s": round(requests / seconds, 1)}


def _client_cost(make_client, count: int) -> float:
    """Milliseconds of CPU to make one client (after a first one, as a long-running process does)."""
    make_client()
    cpu = _cpu_seconds()
    for _ in range(count):
        make_client()
    return round((_cpu_seconds() - cpu) / count * 1000, 3)


POSTERS = {httpx.AsyncClient: _httpx_poster, httpcore.AsyncConnectionPool: _pool_poster}
CLIENTS = {
    "outbound_pool": lambda: outbound_pool(trust_env=False),
    "outbound_client": lambda: outbound_client(trust_env=False, timeout=15),
    "httpx_default": lambda: httpx.AsyncClient(trust_env=False, timeout=15),
}


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    cpu = [r["cpu_ms_per_request"] for r in runs]
    rate = [r["requests_per_s"] for r in runs]
    return {"runs": runs, "cpu_ms_per_request_median": round(statistics.median(cpu), 3),
            "cpu_ms_per_request_range": [min(cpu), max(cpu)], "requests_per_s_median": round(statistics.median(rate), 1)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="contentsvc bench outbound", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="timed POSTs per run (default 3000)")
    p.add_argument("--concurrency", type=int, default=8, help="POSTs in flight, as [deliveries] concurrency "
                   "(default 8)")
    p.add_argument("--runs", type=int, default=3, help="runs of each client, alternating (default 3)")
    p.add_argument("--clients", type=int, default=20, help="clients made to time the making of one (default 20)")
    args = p.parse_args(argv)
    if min(args.requests, args.concurrency, args.runs, args.clients) < 1:
        p.error("every count must be at least 1")

    run = Run()
    receiver_end, port_in = multiprocessing.Pipe()
    receiver = multiprocessing.Process(target=_serve, args=(receiver_end,), daemon=True)
    receiver.start()
    try:
        url = f"http://127.0.0.1:{port_in.recv()}/hook"
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
        for _ in range(args.runs):
            for name, make_client in CLIENTS.items():
                runs[name].append(asyncio.run(_one_run(make_client, url, args.requests, args.concurrency)))
    finally:
        receiver.terminate()
        receiver.join(timeout=10)
    making = {name: _client_cost(make_client, args.clients) for name, make_client in CLIENTS.items()}
    run.finish()

    results = {name: {**_summary(r), "cpu_ms_to_make_a_client": making[name]} for name, r in runs.items()}
    reference = results["httpx_default"]["cpu_ms_per_request_median"]
    results["cpu_per_request_ratio"] = round(results["outbound_client"]["cpu_ms_per_request_median"] / reference, 3)
    results["pool_cpu_per_request_ratio"] = round(results["outbound_pool"]["cpu_ms_per_request_median"] / reference, 3)
    report = {
        **run.head("outbound"),
        "parameters": {"requests": args.requests, "warm_up": WARM_UP, "concurrency": args.concurrency,
                       "runs": args.runs, "clients": args.clients, "body_bytes": len(BODY),
                       "receiver": "asyncio HTTP/1.1 keep-alive server on 127.0.0.1 in its own process, "
                                   "answers 200 at once; its CPU is not counted"},
        "machine": run.machine,
        "targets": {},
        "results": results,
    }
    write_results(RESULT_PATH, report)
    print(f"\ncontentsvc bench outbound  {report['timestamp']}  {machine_line(run.machine)}")
    for name in CLIENTS:
        r = results[name]
        low, high = r["cpu_ms_per_request_range"]
        print(f"  {name:<16} {r['cpu_ms_per_request_median']:.3f} ms CPU per request ({low:.3f}-{high:.3f}), "
              f"{r['requests_per_s_median']:,.0f} requests/s; {r['cpu_ms_to_make_a_client']:.3f} ms CPU to make a "
              f"client")
    print(f"  outbound_client / httpx_default, CPU per request: {results['cpu_per_request_ratio']}")
    print(f"  outbound_pool / httpx_default, CPU per request: {results['pool_cpu_per_request_ratio']}")
    for line in closing_lines(report, RESULT_PATH):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
