/**
 * The lean reference for `GET /me/status`: `node:http` and prepared `node:sqlite` statements doing
 * the same reads as Perch (the session behind the bearer with its peers' registration, then the
 * status document), nothing else. Usage: node lean-status.ts <sqlite file>; prints its port.
 */
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import { DatabaseSync } from "node:sqlite";

const db = new DatabaseSync(process.argv[2]!, { readOnly: true });
const session = db.prepare(
  `select s.public_key, s.kind, s.expires_at, s.revoked_at, p.status as peer_status
   from sessions s left join peers p on p.public_key = s.public_key where s.token_hash = ?`,
);
const status = db.prepare("select document from peer_status where public_key = ?");

createServer((req, res) => {
  const bearer = /^Bearer +(\S+)$/i.exec(req.headers.authorization ?? "")?.[1];
  const row = bearer ? (session.get(createHash("sha256").update(bearer).digest("base64url")) as Record<string, unknown> | undefined) : undefined;
  if (!row || row.revoked_at !== null || (row.expires_at as number) <= Date.now() || row.kind !== "primary" || row.peer_status !== "active") {
    res.writeHead(401, { "content-type": "application/json; charset=utf-8" });
    res.end('{"error":{"code":"INVALID_SESSION","message":"no"}}');
    return;
  }
  const doc = status.get(row.public_key as string) as { document: string } | undefined;
  res.writeHead(200, { "content-type": "application/json; charset=utf-8" });
  res.end(doc ? doc.document : "{}");
}).listen(0, "127.0.0.1", function (this: import("node:net").Server) {
  console.log((this.address() as import("node:net").AddressInfo).port);
});
