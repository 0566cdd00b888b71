/**
 * The lean reference for the chat pass-through: a `node:http` server that reads the body, parses it,
 * renames the model and serialises it again, sends it to the provider over a keep-alive client and
 * answers the provider's bytes; no framework, no authentication, no metrics. What any Node proxy of
 * this shape costs, beside which Perch's own cost is read. The client is `node:http`'s keep-alive
 * agent (as Perch's) or, with `undici`, undici's `Pool` (from bench/anchors, installed with
 * `--anchors`). Usage: node lean-proxy.ts <provider base URL> <http|undici> <upstream model>; prints its port.
 */
import http from "node:http";
import { join } from "node:path";

const [base, client, model] = process.argv.slice(2) as [string, "http" | "undici", string];
const url = new URL(`${base}/chat/completions`);

type Forward = (body: string) => Promise<Buffer>;

async function undiciForward(): Promise<Forward> {
  // Not a dependency of Perch: typed here as far as used.
  type Pool = {
    request(o: { path: string; method: string; headers: Record<string, string>; body: string }): Promise<{ body: { arrayBuffer(): Promise<ArrayBuffer> } }>;
  };
  const { Pool } = (await import(join(import.meta.dirname, "anchors/node_modules/undici/index.js"))) as {
    Pool: new (origin: string, o: { connections: number; pipelining: number }) => Pool;
  };
  const pool = new Pool(url.origin, { connections: 256, pipelining: 1 });
  return async (body) => {
    const r = await pool.request({ path: url.pathname, method: "POST", headers: { "content-type": "application/json" }, body });
    return Buffer.from(await r.body.arrayBuffer());
  };
}

function httpForward(): Forward {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256, scheduling: "lifo" });
  const target = { hostname: url.hostname, port: url.port, path: url.pathname, method: "POST", agent };
  return (body) =>
    new Promise((resolve, reject) => {
      const req = http.request({ ...target, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(body);
    });
}

const forward = client === "undici" ? await undiciForward() : httpForward();

http
  .createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const request = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { model: string };
      request.model = model;
      forward(JSON.stringify(request)).then(
        (answer) => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(answer);
        },
        () => {
          res.writeHead(502);
          res.end();
        },
      );
    });
  })
  .listen(0, "127.0.0.1", function (this: import("node:net").Server) {
    console.log((this.address() as import("node:net").AddressInfo).port);
  });

// Exits (rather than dies) on SIGTERM, so that `--cpu-prof` writes its profile.
process.on("SIGTERM", () => process.exit(0));
