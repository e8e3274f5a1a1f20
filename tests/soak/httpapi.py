"""The soak's HTTP client (docs/reference/http.md): HTTPS to an agent's bridge address with a
client certificate of the run's CA. The agents' certificates name 127.0.0.1 and their node
id, not the bridge address, so the chain is checked and the host name is not."""
import http.client
import json
import ssl

SERVICE = "soak"


class Api:
    def __init__(self, cluster):
        ctx = ssl.create_default_context(cafile=cluster.ca)
        ctx.check_hostname = False
        ctx.load_cert_chain(*cluster.client_cert)
        self.ctx = ctx
        self.ip = cluster.net.ip
        self.port = cluster.http_port

    def connect(self, n, timeout):
        return http.client.HTTPSConnection(self.ip[n], self.port[n], context=self.ctx,
                                           timeout=timeout)

    def request(self, n, method, path, body=None, timeout=5.0):
        """(status, decoded JSON or None), or None when the agent did not answer."""
        conn = self.connect(n, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            raw = r.read()
            try:
                return r.status, json.loads(raw) if raw else None
            except ValueError:
                return r.status, None
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def text(self, n, path, timeout=5.0):
        """The body of a GET as text (/metrics), or None."""
        conn = self.connect(n, timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.read().decode(errors="replace") if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def put(self, n, iid, address, meta, timeout=5.0):
        """(acknowledged, why not)."""
        return answer(self.request(n, "PUT", f"/v1/services/{SERVICE}/instances/{iid}",
                                   {"address": address, "meta": meta}, timeout))

    def delete(self, n, iid, timeout=5.0):
        return answer(self.request(n, "DELETE", f"/v1/services/{SERVICE}/instances/{iid}",
                                   None, timeout))

    def view(self, n, timeout=5.0):
        """iid -> (address, meta) of the instances agent n serves, or None."""
        r = self.request(n, "GET", f"/v1/services/{SERVICE}", None, timeout)
        if r is None or r[0] != 200 or not isinstance(r[1], list):
            return None
        return {i["instance"]: (i["address"], i["meta"]) for i in r[1]}

    def has(self, n, iid, timeout=3.0):
        """Whether agent n shows instance iid live, or None when it did not answer."""
        r = self.request(n, "GET", f"/v1/services/{SERVICE}/instances/{iid}", None, timeout)
        if r is None or r[0] not in (200, 404):
            return None
        return r[0] == 200

    def watch(self, n, last_id=None, timeout=30.0):
        """A `?watch` stream of agent n: yields (event, id, data) until it ends (raises
        OSError or http.client.HTTPException when it breaks). Raises ValueError when the
        agent refuses the Last-Event-ID."""
        conn = self.connect(n, timeout)
        try:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            conn.request("GET", f"/v1/services/{SERVICE}?watch", headers=headers)
            r = conn.getresponse()
            if r.status == 400:
                raise ValueError(r.read().decode(errors="replace"))
            if r.status != 200:
                raise OSError(f"HTTP {r.status}")
            yield from parse_sse(r)
        finally:
            conn.close()


def answer(r):
    if r is None:
        return False, "no answer"
    if r[0] == 200:
        return True, ""
    err = r[1].get("error", {}) if isinstance(r[1], dict) else {}
    return False, f"HTTP {r[0]} {err.get('message', '')}".strip()


def parse_sse(stream):
    event, eid, data = None, None, []
    while True:
        line = stream.readline()
        if not line:
            return
        line = line.decode().rstrip("\r\n")
        if not line:
            if event is not None:
                yield event, eid, json.loads("\n".join(data)) if data else None
            event, eid, data = None, None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, v = line.partition(":")
            v = v[1:] if v.startswith(" ") else v
            if field == "event":
                event = v
            elif field == "id":
                eid = v
            elif field == "data":
                data.append(v)
