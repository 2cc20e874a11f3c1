"""A word-frequency service in Python, written from docs/executors.md alone: the proof that
the document is enough to implement the protocol without Reeve's crate.

    WORDFREQ_SECRET=whsec_... python tests/executors/service.py [--port N] [--report-every N]

It prints `listening on http://127.0.0.1:PORT` once it accepts jobs. Each POST is a signed
job or cancel (Standard Webhooks, checked with the official `standardwebhooks` package). A job
is answered `202` and worked on in a thread: the text input is read line by line, progress
(and, for a metered kind, usage in lines) is reported as it goes, the 100 most frequent words
are uploaded as the output `top-100.csv`, and a `result` report ends the attempt. A signed
cancel stops the attempt it names at its next line: one `heartbeat` then tells Reeve (whose
`409 canceled` ends the task at once), and `canceled <task id> <attempt>` is printed.
`--line-delay` slows the reading down, so a test can cancel mid-way. Standard library and
`standardwebhooks` only.
"""

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

OUTPUT = "top-100.csv"
# A word: letters and digits, with apostrophes inside it; lowercased.
WORD = re.compile(r"(?:[^\W_]|')+")


class Stop(Exception):
    """Reeve answered 409: the attempt is superseded, canceled or ended. Stop, report nothing more."""


class Failed(Exception):
    def __init__(self, message, retryable):
        super().__init__(message)
        self.retryable = retryable


class Reports:
    """Reports on one attempt: POST {report.url} with its bearer token, each report with an id
    of its own, sent again with the same id after a lost connection, 408, 429 or 5xx."""

    def __init__(self, report):
        self.url = report["url"]
        self.token = report["token"]

    def send(self, body, tries=5):
        report = {"id": f"{body['type']}-{uuid.uuid4().hex}", **body}
        data = json.dumps(report).encode()
        wait = 0.25
        for attempt in range(tries):
            request = urllib.request.Request(self.url, data=data, method="POST", headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    text = answer.read()
                    return json.loads(text) if text else {}
            except urllib.error.HTTPError as e:
                text = e.read()
                if e.code in (408, 429) or e.code >= 500:
                    retry_after = e.headers.get("Retry-After")
                    if retry_after and retry_after.isdigit():
                        wait = max(wait, int(retry_after))
                else:
                    try:
                        code = json.loads(text)["error"]["code"]
                    except (ValueError, KeyError, TypeError):
                        code = ""
                    if e.code == 409 and code in ("superseded", "canceled", "ended"):
                        raise Stop(code)
                    raise RuntimeError(f"report {report['type']} refused: {e.code} {code}")
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                pass
            if attempt + 1 < tries:
                time.sleep(wait)
                wait *= 2
        raise RuntimeError(f"report {report['type']} could not be delivered")

    def progress(self, fraction, message=None):
        body = {"type": "progress", "fraction": min(max(fraction, 0.0), 1.0)}
        if message is not None:
            body["message"] = message[:500]
        self.send(body)

    def usage(self, used):
        self.send({"type": "usage", "used": used})

    def output(self, name, content_type, data):
        digest = hashlib.sha256(data).hexdigest()
        upload = self.send({"type": "output", "name": name, "size": len(data), "content_type": content_type,
                            "sha256": digest})
        headers = {k: v for k, v in upload.get("headers", {}).items() if k.lower() != "content-length"}
        put = urllib.request.Request(upload["url"], data=data, method=upload.get("method", "PUT"), headers=headers)
        with urllib.request.urlopen(put, timeout=60) as answer:
            answer.read()

    def result(self, result, used=None):
        body = {"type": "result", "result": result}
        if used is not None:
            body["used"] = used
        self.send(body)

    def failure(self, message, retryable):
        self.send({"type": "failure", "retryable": retryable, "message": message[:500]})


class Running:
    """The attempts under way, by (task id, attempt): a cancel sets its attempt's event."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = {}

    def start(self, task):
        stop = threading.Event()
        with self.lock:
            self.attempts[(task["id"], task["attempt"])] = stop
        return stop

    def end(self, task):
        with self.lock:
            self.attempts.pop((task["id"], task["attempt"]), None)

    def cancel(self, task):
        with self.lock:
            stop = self.attempts.get((task.get("id"), task.get("attempt")))
        if stop is not None:
            stop.set()
        return stop is not None


RUNNING = Running()


def count_words(job, reports, every, stop, line_delay):
    files = job.get("files") or []
    if not files:
        raise Failed("the input names no text file (upload_id)", retryable=False)
    file = files[0]
    metered = job.get("metered") is not None
    try:
        answer = urllib.request.urlopen(file["url"], timeout=60)
    except urllib.error.HTTPError as e:
        raise Failed("the input file could not be read", retryable=e.code >= 500)
    except urllib.error.URLError:
        raise Failed("the input could not be read", retryable=True)
    size = max(file.get("size") or 1, 1)
    reports.progress(0.0, "reading")
    counts, lines, words, read = Counter(), 0, 0, 0
    with answer:
        for raw in answer:
            read += len(raw)
            lines += 1
            for word in WORD.findall(raw.decode("utf-8", errors="replace")):
                word = word.strip("'")
                if word:
                    words += 1
                    counts[word.lower()] += 1
            if stop.is_set():
                # Told the buyer canceled: Reeve ends the task at this report, answering 409 canceled.
                reports.send({"type": "heartbeat"})
                raise Stop("canceled")
            if line_delay:
                time.sleep(line_delay)
            if lines % every == 0:
                reports.progress(min(read / size, 0.99), f"{lines} lines read")
                if metered:
                    reports.usage(lines)
    reports.progress(1.0, f"{lines} lines read; writing {OUTPUT}")
    if metered:
        reports.usage(lines)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    csv = "word,count\n" + "".join(f"{w},{c}\n" for w, c in ranked[:100])
    reports.output(OUTPUT, "text/csv", csv.encode())
    summary = {"lines": lines, "words": words, "distinct": len(counts),
               "top": [{"word": w, "count": c} for w, c in ranked[:10]], "output": OUTPUT}
    reports.result(summary, lines if metered else None)


def work(job, every, line_delay):
    reports = Reports(job["report"])
    stop = RUNNING.start(job["task"])
    try:
        count_words(job, reports, every, stop, line_delay)
    except Stop as why:
        print(f"task {job['task']['id']}: {why}, stopping", file=sys.stderr)
        if stop.is_set():
            print(f"canceled {job['task']['id']} {job['task']['attempt']}", flush=True)
    except Failed as failed:
        try:
            reports.failure(str(failed), failed.retryable)
        except Stop:
            pass
    except Exception as e:  # anything else is worth another attempt
        print(f"task {job['task']['id']}: {e!r}", file=sys.stderr)
        try:
            reports.failure("the service failed", retryable=True)
        except Exception:
            pass
    finally:
        RUNNING.end(job["task"])


class Handler(BaseHTTPRequestHandler):
    webhook = None
    every = 10_000
    line_delay = 0.0
    seen = set()
    lock = threading.Lock()

    def answer(self, status, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            message = self.webhook.verify(body, dict(self.headers.items()))
        except WebhookVerificationError as e:
            return self.answer(401, {"error": str(e)})
        if not isinstance(message, dict) or message.get("protocol") != 1:
            return self.answer(400, {"error": "not a protocol 1 message"})
        if message.get("type") == "cancel":
            # Answered whatever it names: an attempt not running here has ended, or never came.
            RUNNING.cancel(message.get("task") or {})
            return self.answer(200, {})
        if message.get("type") != "job":
            return self.answer(400, {"error": "unknown message type"})
        # A redelivered job (the same webhook-id) is the same attempt: accepted once, worked once.
        with self.lock:
            first = self.headers["webhook-id"] not in self.seen
            self.seen.add(self.headers["webhook-id"])
        if first:
            threading.Thread(target=work, args=(message, self.every, self.line_delay), daemon=True).start()
        self.answer(202)

    def log_message(self, format, *args):
        print(format % args, file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--report-every", type=int, default=10_000)
    parser.add_argument("--line-delay", type=float, default=0.0, help="seconds to wait after each line")
    args = parser.parse_args()
    Handler.webhook = Webhook(os.environ["WORDFREQ_SECRET"])
    Handler.every = max(args.report_every, 1)
    Handler.line_delay = max(args.line_delay, 0.0)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
