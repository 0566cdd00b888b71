/**
 * Portkey's open-source gateway as a reference point for `npm run bench -- compat --anchors`. It lives
 * in its own package (bench/anchors), installed on demand, so it never becomes a dependency of Perch.
 * Every failure (install, start, a first call) is returned as a reason, never thrown.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { join } from "node:path";
import { ROOT } from "./support.ts";

const ANCHORS = join(ROOT, "bench/anchors");
const GATEWAY = join(ANCHORS, "node_modules/@portkey-ai/gateway");
const START_TIMEOUT_MS = 30_000;
const INSTALL_TIMEOUT_MS = 300_000;

export interface Portkey {
  /** Base URL ending in /v1. */
  base: string;
  /** Headers that route a request to the upstream. */
  headers: Record<string, string>;
  child: ChildProcess;
  versions: { gateway: string; hono_node_server: string };
  stop(): Promise<void>;
}

export type PortkeyStart = { ok: true; portkey: Portkey } | { ok: false; reason: string };

/** Installs bench/anchors when its node_modules is missing, starts the gateway, checks one call of each kind. */
export async function startPortkey(upstreamBase: string): Promise<PortkeyStart> {
  const script = join(GATEWAY, "build/start-server.js");
  // Missing node_modules, or one a failed install left incomplete.
  if (!existsSync(script)) {
    const installed = await run("npm", ["install", "--prefix", ANCHORS, "--no-audit", "--no-fund"], INSTALL_TIMEOUT_MS);
    if (installed) return { ok: false, reason: `npm install --prefix bench/anchors failed: ${installed}` };
  }
  if (!existsSync(script)) return { ok: false, reason: "bench/anchors is installed but has no @portkey-ai/gateway/build/start-server.js" };
  const versions = { gateway: versionOf(GATEWAY), hono_node_server: honoNodeServerVersion() };

  const port = await freePort();
  const child = spawn(process.execPath, [script, `--port=${port}`, "--headless"], { stdio: ["ignore", "ignore", "pipe"], cwd: ANCHORS });
  let stderr = "";
  child.stderr!.on("data", (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-2000);
  });
  let exited: string | undefined;
  child.once("exit", (code, signal) => {
    exited = `exited with ${signal ?? code}`;
  });
  child.once("error", (e) => {
    exited = `could not be spawned: ${e.message}`;
  });
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null || exited) return;
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
  };
  const base = `http://127.0.0.1:${port}/v1`;
  const headers = { "x-portkey-provider": "openai", "x-portkey-custom-host": upstreamBase };
  const fail = async (why: string): Promise<PortkeyStart> => {
    await stop();
    const tail = stderr.trim().split("\n").slice(-3).join(" | ");
    return { ok: false, reason: `Portkey gateway ${versions.gateway}: ${why}${tail ? ` (stderr: ${tail})` : ""}` };
  };

  // Ready once a non-streaming call goes through it to the upstream.
  const deadline = Date.now() + START_TIMEOUT_MS;
  let last = "no answer";
  for (;;) {
    if (exited) return fail(`the gateway ${exited}`);
    const r = await post(base, headers, { model: "short", messages: [{ role: "user", content: "hi" }] }, 2000);
    if (r.status === 200 && r.body.includes('"choices"')) break;
    last = r.status ? `status ${r.status}: ${r.body.slice(0, 200)}` : r.body;
    if (Date.now() > deadline) return fail(`no successful chat call within ${START_TIMEOUT_MS / 1000} s (last: ${last})`);
    await new Promise((r) => setTimeout(r, 200));
  }
  // Its streaming depends on the @hono/node-server pinned in bench/anchors: check it relays a whole stream.
  const s = await post(base, headers, { model: "chunks-3", messages: [{ role: "user", content: "hi" }], stream: true }, 10_000);
  if (s.status !== 200 || !s.body.includes("w2") || !s.body.includes("[DONE]")) {
    return fail(`streaming does not work (status ${s.status}: ${s.body.slice(0, 200)})`);
  }
  return { ok: true, portkey: { base, headers, child, versions, stop } };
}

function versionOf(dir: string): string {
  try {
    return String(JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).version);
  } catch {
    return "unknown";
  }
}

/** The @hono/node-server the gateway resolves: its own nested copy first, else the package's top level. */
function honoNodeServerVersion(): string {
  for (const dir of [join(GATEWAY, "node_modules/@hono/node-server"), join(ANCHORS, "node_modules/@hono/node-server")]) {
    if (existsSync(dir)) return versionOf(dir);
  }
  return "missing";
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

/** Runs a command; undefined on success, else why it failed (with the start of its output). */
function run(cmd: string, args: string[], timeoutMs: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    let out = "";
    // `npm run -s` passes a silent log level down: ask for errors, so a failure says why.
    const env = { ...process.env, npm_config_loglevel: "error" };
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], timeout: timeoutMs, env });
    const keep = (c: Buffer) => {
      if (out.length < 3000) out += c.toString();
    };
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    child.once("error", (e) => resolve(e.message));
    child.once("close", (code, signal) => {
      // npm names the cause (code, errno) on its first lines.
      const head = out.trim().split("\n").slice(0, 4).join(" | ");
      resolve(code === 0 ? undefined : `${signal ? `killed by ${signal}` : `exit ${code}`}${head ? `: ${head}` : ""}`);
    });
  });
}

/** One POST on a fresh connection, read to its end; status 0 and the error as body when it fails or times out. */
function post(base: string, headers: Record<string, string>, json: unknown, timeoutMs: number): Promise<{ status: number; body: string }> {
  const body = JSON.stringify(json);
  return new Promise((resolve) => {
    const req = http.request(
      `${base}/chat/completions`,
      { method: "POST", agent: false, headers: { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) } },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => {
          text += c;
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
        res.on("error", (e) => resolve({ status: 0, body: e.message }));
      },
    );
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`timed out after ${timeoutMs} ms`)));
    req.on("error", (e) => resolve({ status: 0, body: e.message }));
    req.end(body);
  });
}
