/**
 * The fast layer: a surface's gate (`Surface.gate`, `mountSurfaces`) runs before every route of the
 * surface, native or Hono, whether or not the route is named anywhere; and the Compatible API's
 * routes, walked from the node's route table (not from a list), are all behind its gate. In
 * process (`Node.request`), no port.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { Hono } from "hono";
import { loadConfig } from "../src/config/config.ts";
import { COMPAT_BASE, COMPAT_BODY_LIMIT } from "../src/http/compat/surface.ts";
import type { AppEnv } from "../src/http/env.ts";
import { writeJson } from "../src/http/json.ts";
import type { Surface } from "../src/http/surface.ts";
import { Node } from "../src/server.ts";
import { tempDir } from "./support/server.ts";

const KEY = "sk-gate";

/** A path matching `pattern` (`/contacts/:name` → `/contacts/x`). */
const concrete = (pattern: string) => pattern.replace(/:[^/]+/g, "x").replace(/\*$/, "x");

/** A surface whose gate admits a request carrying `x-pass`; one Hono route, one with a parameter, one native. */
function gatedSurface(): Surface {
  const app = new Hono<AppEnv>();
  app.get("/plain", (c) => c.json({ ok: true }));
  app.post("/things/:id", (c) => c.json({ id: c.req.param("id") }));
  return {
    base: "/gated",
    app,
    gate: {
      admit: (x) => {
        if (x.incoming.headers["x-pass"] !== "yes") throw Object.assign(new Error("no pass"), { refused: true });
      },
    },
    failure: (err) => ({ status: (err as { refused?: boolean }).refused ? 401 : 500, body: { refused: true }, contentType: "application/json" }),
    unrouted: (c, allow) => c.json({ unrouted: true, allow }, allow.length > 0 ? 405 : 404),
    native: [{ method: "GET", path: "/native", guards: [], serve: async (x) => writeJson(x, 200, '{"native":true}') }],
  };
}

describe("a surface's gate", () => {
  let node: Node;
  let dataDir: string;
  before(async () => {
    dataDir = tempDir();
    node = await Node.build({
      config: loadConfig(
        {},
        {
          port: 0,
          host: "127.0.0.1",
          data_dir: dataDir,
          log_level: "silent",
          api_keys: [{ name: "app", sha256: createHash("sha256").update(KEY).digest("hex"), models: ["*"] }],
        },
      ),
      surfaces: () => [gatedSurface()],
    });
  });
  after(async () => {
    await node.close();
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("runs before every route of its surface, Hono or native, though no route names it", async () => {
    const routes = node.routes.filter((r) => r.base === "/gated");
    assert.deepEqual(routes.map((r) => `${r.method} ${r.path}`).sort(), ["GET /gated/native", "GET /gated/plain", "POST /gated/things/:id"]);
    for (const r of routes) {
      const path = concrete(r.path);
      const refused = await node.request(path, { method: r.method });
      assert.equal(refused.status, 401, `${r.method} ${path} without a pass`);
      assert.deepEqual(await refused.json(), { refused: true });
      const admitted = await node.request(path, { method: r.method, headers: { "x-pass": "yes" } });
      assert.equal(admitted.status, 200, `${r.method} ${path} with a pass`);
    }
  });

  test("does not run for a request no route of it answers: 404 and 405 as before", async () => {
    const missing = await node.request("/gated/nothing");
    assert.equal(missing.status, 404);
    const otherMethod = await node.request("/gated/plain", { method: "DELETE" });
    assert.equal(otherMethod.status, 405);
    assert.deepEqual(await otherMethod.json(), { unrouted: true, allow: ["GET"] });
  });

  test("every route of the Compatible API in the node's route table is behind its gate: 401 without a key, 413 over its body limit", async () => {
    const compat = node.routes.filter((r) => r.base === COMPAT_BASE);
    // The table is the node's own: the routes the surface registers, whichever way.
    for (const known of ["POST /openai/v1/chat/completions", "GET /openai/v1/models", "POST /openai/v1/audio/speech", "POST /openai/v1/audio/transcriptions"]) {
      assert.ok(
        compat.some((r) => `${r.method} ${r.path}` === known),
        `${known} in the table`,
      );
    }
    for (const r of compat) {
      const path = concrete(r.path);
      const res = await node.request(path, { method: r.method });
      assert.equal(res.status, 401, `${r.method} ${path} without a key`);
      const body = (await res.json()) as { error: { code: string; type: string } };
      assert.equal(body.error.code, "invalid_api_key", `${r.method} ${path}`);
      if (r.method === "GET") continue;
      // A declared length over the limit is refused unread, before the caller is looked at.
      const large = await node.request(path, {
        method: r.method,
        headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json", "content-length": String(COMPAT_BODY_LIMIT + 1) },
        body: "{}",
      });
      assert.equal(large.status, 413, `${r.method} ${path} over the limit`);
      assert.equal(((await large.json()) as { error: { code: string } }).error.code, "request_too_large");
    }
  });
});
