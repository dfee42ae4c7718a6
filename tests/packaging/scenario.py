#!/usr/bin/env python3
"""The packages' end-to-end scenario (docs/deploy.md, "Packages"): one driver, standard library
only, for the container image, the compose cluster and the Debian package.

  scenario.py basic URL STATE        wait until ready; sign in as the shipped admin; create a user and
                                     sign in as them; push and pull; upload two bundles and switch to
                                     the second; upload and download an attachment; export Parquet.
                                     Writes what it made to STATE (JSON).
  scenario.py storm URL STATE        DEVICES devices push batches at once until the server goes away
                                     (or SECONDS pass); every acknowledged push's records and every
                                     push left unanswered go into STATE. While it runs, STATE.acked
                                     holds the count of records acknowledged so far (every 100), for
                                     a test that stops the server in the middle; a file STATE.stop
                                     ends the storm.
  scenario.py check URL STATE        against the same data, later (a restart, a new container,
                                     another node): the tokens of `basic` still valid, the user, the
                                     records, the active bundle and the attachment there; with a storm
                                     behind, every unanswered push sent again as devices do (same
                                     transmission id), then every acknowledged record present and no
                                     record stored twice.

Options: --devices N (64), --seconds S (120), --fixtures DIR (tests/fixtures/upstream),
--admin-password P (admin). Exit status 0 when every check held; a failed check names itself.
"""
import argparse
import concurrent.futures
import hashlib
import io
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Failed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise Failed(message)


class Api:
    def __init__(self, base, token=None, timeout=60):
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, bytes); HTTP errors are answers, connection failures raise OSError."""
        data = raw
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["content-type"] = "application/json"
        if self.token:
            hdrs["authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, method, path, body=None, want=200, **kw):
        # A 503 asks the client to try again (docs/api.md's error model), as every real client
        # does: a node of a cluster just started may still be opening its database connections.
        for _ in range(5):
            status, headers, data = self.request(method, path, body, **kw)
            if status != 503 or want == 503:
                break
            time.sleep(float(headers.get("retry-after") or 1))
        expect(status == want, f"{method} {path}: {status} (wanted {want}): {data[:300]!r}")
        return json.loads(data) if data else None


def multipart(fields, files):
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    for name, value in fields.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, content) in files.items():
        out.write(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: application/zip\r\n\r\n".encode()
        )
        out.write(content)
        out.write(b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), {"content-type": f"multipart/form-data; boundary={boundary}"}


def wait_ready(url, seconds=180):
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            status, _, data = Api(url, timeout=5).request("GET", "/ready")
            if status == 200:
                return
            last = f"{status} {data[:200]!r}"
        except OSError as e:
            last = str(e)
        time.sleep(0.5)
    raise Failed(f"{url}/ready did not answer 200 within {seconds} s (last: {last})")


def login(url, username, password):
    answer = Api(url).json("POST", "/auth/login", {"username": username, "password": password})
    expect(answer.get("token") and answer.get("refresh_token"), f"login answer without tokens: {answer}")
    return answer["token"]


def pull_all(api, client_id):
    """Every record from the start: {id: record}, failing on an id seen twice."""
    records, since, seen = {}, 0, 0
    while True:
        page = api.json("POST", "/sync/pull?limit=1000", {"client_id": client_id, "since": {"version": since}})
        for r in page["records"]:
            expect(r["observation_id"] not in records, f"pull: {r['observation_id']} came twice")
            records[r["observation_id"]] = r
            seen += 1
        since = page["change_cutoff"] if page["has_more"] else page["current_version"]
        if not page["has_more"]:
            return records


def record(rid, i, form_type="scenario"):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"observation_id": rid, "form_type": form_type, "form_version": "1",
            "data": {"n": i, "note": f"record {i}", "ok": True}, "created_at": now, "updated_at": now}


def basic(args):
    url = args.url
    wait_ready(url)
    state = {"url": url}

    admin_token = login(url, "admin", args.admin_password)
    admin = Api(url, admin_token)
    me = admin.json("GET", "/auth/me")
    expect(me["data"]["username"] == "admin", f"/auth/me: {me}")
    state["admin_token"] = admin_token
    print("scenario: signed in as admin")

    username = f"field-{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    admin.json("POST", "/users", {"username": username, "password": password, "role": "read-write"}, want=201)
    user = Api(url, login(url, username, password))
    state.update(username=username, password=password, user_token=user.token)
    print(f"scenario: created and signed in as {username}")

    ids = [f"scenario-{uuid.uuid4().hex[:12]}" for _ in range(5)]
    push = {"transmission_id": str(uuid.uuid4()), "client_id": f"device-{username}",
            "records": [record(rid, i) for i, rid in enumerate(ids)]}
    answer = user.json("POST", "/sync/push", push)
    expect(answer["success_count"] == len(ids), f"push: {answer}")
    pulled = pull_all(user, f"tablet-{username}")
    for i, rid in enumerate(ids):
        expect(rid in pulled and pulled[rid]["data"]["n"] == i, f"pull: {rid} missing or changed")
    state["record_ids"] = ids
    print(f"scenario: pushed {len(ids)} records and pulled them back")

    fixtures = args.fixtures
    versions = []
    for name, activate in (("valid_bundle01.zip", "true"), ("valid_bundle02.zip", "false")):
        with open(os.path.join(fixtures, name), "rb") as f:
            body, headers = multipart({"activate": activate}, {"bundle": (name, f.read())})
        answer = admin.json("POST", "/app-bundle/push", raw=body, headers=headers)
        versions.append(answer["version"])
    admin.json("POST", f"/app-bundle/switch/{versions[1]}")
    # Behind a balancer the other nodes learn of the switch through LISTEN/NOTIFY, within 1 s
    # (docs/deploy.md): wait until three reads in a row, spread over the nodes, agree.
    deadline, agreeing = time.monotonic() + 3, 0
    while agreeing < 3:
        manifest = user.json("GET", "/app-bundle/manifest")
        agreeing = agreeing + 1 if manifest["version"] == versions[1] else 0
        expect(agreeing or time.monotonic() < deadline,
               f"manifest 3 s after the switch: {manifest.get('version')}")
        if not agreeing:
            time.sleep(0.05)
    status, _, _ = user.request("GET", f"/app-bundle/download/{manifest['files'][0]['path']}")
    expect(status == 200, f"bundle file download: {status}")
    state["bundle_version"] = versions[1]
    print(f"scenario: uploaded bundles {versions}, switched to {versions[1]}")

    content = os.urandom(150_000)
    attachment = f"{uuid.uuid4().hex}.jpg"
    status, _, data = user.request("PUT", f"/attachments/{attachment}", raw=content,
                                   headers={"content-type": "image/jpeg"})
    expect(status == 200, f"attachment upload: {status} {data[:200]!r}")
    status, headers, data = user.request("GET", f"/attachments/{attachment}")
    expect(status == 200 and data == content, f"attachment download: {status}, {len(data)} bytes")
    state.update(attachment_id=attachment, attachment_sha256=hashlib.sha256(content).hexdigest())
    print("scenario: uploaded and downloaded an attachment")

    status, headers, data = admin.request("GET", "/dataexport/parquet")
    expect(status == 200, f"parquet export: {status} {data[:200]!r}")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
        expect("scenario.parquet" in names, f"parquet export entries: {names}")
        parquet = z.read("scenario.parquet")
    expect(parquet[:4] == b"PAR1" and parquet[-4:] == b"PAR1", "scenario.parquet is not a Parquet file")
    print(f"scenario: exported Parquet ({len(data)} bytes, {names})")

    save(args.state, state)
    print("scenario: basic passed")


def storm(args):
    state = load(args.state)
    wait_ready(args.url)
    for leftover in (args.state + ".stop", args.state + ".acked"):
        if os.path.exists(leftover):
            os.remove(leftover)
    token = login(args.url, state["username"], state["password"])
    run = uuid.uuid4().hex[:6]
    stop_at = time.time() + args.seconds
    lock = threading.Lock()
    acked, pending = [], []
    gone = threading.Event()

    def device(n):
        api = Api(args.url, token, timeout=30)
        client = f"storm-{run}-{n}"
        batch = 0
        while time.time() < stop_at and not gone.is_set() and not os.path.exists(args.state + ".stop"):
            ids = [f"storm-{run}-{n}-{batch}-{k}" for k in range(5)]
            push = {"transmission_id": str(uuid.uuid4()), "client_id": client,
                    "records": [record(rid, k, "storm") for k, rid in enumerate(ids)]}
            try:
                status, _, data = api.request("POST", "/sync/push", push)
            except OSError:
                status, data = None, b""
            with lock:
                if status == 200:
                    acked.extend(ids)
                    if len(acked) % 100 == 0:
                        with open(args.state + ".acked", "w") as progress:
                            progress.write(str(len(acked)))
                elif status is None or status >= 500:
                    # Unanswered, or a 5xx (a balancer's 502 for a node that died, a 503 while
                    # stopping): the device keeps the push to send again. No answer at all means
                    # the server is gone: the storm ends.
                    pending.append(push)
                    if status is None:
                        gone.set()
                else:
                    raise Failed(f"storm push: {status} {data[:200]!r}")
            batch += 1
            if status is not None and status >= 500:
                time.sleep(0.2)

    with concurrent.futures.ThreadPoolExecutor(args.devices) as pool:
        for f in [pool.submit(device, n) for n in range(args.devices)]:
            f.result()
    state["storm"] = {"acked": acked, "pending": pending, "token": token}
    save(args.state, state)
    print(f"scenario: storm of {args.devices} devices: {len(acked)} records acknowledged, "
          f"{len(pending)} pushes unanswered")


def check(args):
    state = load(args.state)
    url = args.url
    wait_ready(url)
    admin = Api(url, state["admin_token"])
    me = admin.json("GET", "/auth/me")
    expect(me["data"]["username"] == "admin", f"the admin's old token: {me}")
    user = Api(url, state["user_token"])
    me = user.json("GET", "/auth/me")
    expect(me["data"]["username"] == state["username"], f"the user's old token: {me}")
    login(url, state["username"], state["password"])
    print("scenario: the tokens issued before are valid, the user signs in")

    pushed_again = 0
    storm_state = state.get("storm")
    if storm_state:
        # Devices send an unanswered push again, unchanged: applied once or replayed, never twice.
        resender = Api(url, storm_state["token"])
        for push in storm_state["pending"]:
            answer = resender.json("POST", "/sync/push", push)
            expect(answer["success_count"] == len(push["records"]), f"push sent again: {answer}")
            pushed_again += 1

    records = pull_all(admin, f"check-{uuid.uuid4().hex[:8]}")
    for rid in state["record_ids"]:
        expect(rid in records, f"record {rid} of the basic scenario is missing")
    if storm_state:
        missing = [rid for rid in storm_state["acked"] if rid not in records]
        expect(not missing, f"{len(missing)} acknowledged records missing, e.g. {missing[:5]}")
        resent = [r["observation_id"] for p in storm_state["pending"] for r in p["records"]]
        sample = resent + random.sample(storm_state["acked"], min(100, len(storm_state["acked"])))
        twice = []
        for rid in sample:
            history = admin.json("GET", f"/observations/{rid}/history")
            if len(history["revisions"]) != 1 or history["has_more"]:
                twice.append(rid)
        expect(not twice, f"records stored more than once: {twice[:5]}")
        print(f"scenario: all {len(storm_state['acked'])} acknowledged records there, "
              f"{pushed_again} unanswered pushes sent again, 0 duplicated ({len(sample)} histories read)")

    manifest = user.json("GET", "/app-bundle/manifest")
    expect(manifest["version"] == state["bundle_version"], f"active bundle: {manifest['version']}")
    status, _, data = user.request("GET", f"/attachments/{state['attachment_id']}")
    expect(status == 200 and hashlib.sha256(data).hexdigest() == state["attachment_sha256"],
           f"attachment after restart: {status}")
    print("scenario: records, active bundle and attachment there")
    print("scenario: check passed")


def save(path, state):
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["basic", "storm", "check"])
    p.add_argument("url")
    p.add_argument("state")
    p.add_argument("--devices", type=int, default=64)
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--fixtures", default=os.path.join(ROOT, "tests", "fixtures", "upstream"))
    p.add_argument("--admin-password", default="admin")
    args = p.parse_args()
    try:
        {"basic": basic, "storm": storm, "check": check}[args.step](args)
    except Failed as e:
        print(f"scenario {args.step}: FAILED: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
