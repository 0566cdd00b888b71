/**
 * A fleet on this machine, for the end-to-end test (fleet-haproxy.test.ts) and the benchmark
 * (bench/fleet.ts): the capacity benchmark's provider (answers at once), the nodes' configuration
 * of a talking agent on it, and HAProxy in front of the nodes as docs/operations.md configures it.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT } from "./server.ts";

export function hasHaproxy(): boolean {
  try {
    execFileSync("haproxy", ["-v"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** bench/capacity-provider.ts in its own process (`env` added, e.g. BENCH_CAPACITY_REPLY_MS); resolves with its base URL. */
export async function startCapacityProvider(env: Record<string, string> = {}): Promise<{ url: string; process: ChildProcess }> {
  const child = spawn(process.execPath, ["--disable-warning=ExperimentalWarning", join(ROOT, "bench/capacity-provider.ts")], {
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, ...env },
  });
  process.once("exit", () => child.kill("SIGKILL"));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.once("data", (d: Buffer) => resolve(d.toString().trim().split("\n")[0]!));
    child.once("exit", (code) => reject(new Error(`the capacity provider exited with ${code}`)));
  });
  return { url, process: child };
}

/** A node's configuration where devices talk to agent `talker` on the provider at `providerUrl` (its transcription, chat and speech), any limit of rate off. */
export function talkerOn(providerUrl: string) {
  return {
    rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 },
    providers: [{ id: "fake", kind: "openai-compatible" as const, base_url: providerUrl, max_retries: 0 }],
    models: [
      { id: "chat", kind: "chat" as const, provider: "fake", upstream_model: "scripted" },
      { id: "voice-tts", kind: "speech" as const, provider: "fake", upstream_model: "tts-1" },
      { id: "voice-stt", kind: "transcription" as const, provider: "fake", upstream_model: "whisper-1" },
    ],
    agents: [{ id: "talker", model: "chat", instructions: "Answer briefly.", voice: "alloy", speech_model: "voice-tts", transcription_model: "voice-stt" }],
    voice: { agent: "talker" },
  };
}

/** One backend of `nodes` whose servers are up while `path` answers 200 (checked every 250 ms, one failure takes a node out). */
function backend(name: string, path: string, nodes: Array<[string, number]>): string {
  return `backend ${name}
  balance leastconn
  option httpchk
  http-check send meth GET uri ${path} ver HTTP/1.1 hdr host perch.internal
  http-check expect status 200
  default-server inter 250ms fall 1 rise 1
${nodes.map(([server, p]) => `  server ${server} 127.0.0.1:${p} check`).join("\n")}
`;
}

/** HAProxy as docs/operations.md configures it, on `port` in front of `nodes`, health-checking `/readyz`. */
export function haproxyConfig(port: number, nodes: Array<[string, number]>): string {
  return `global
  maxconn 2000
defaults
  mode http
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  timeout check 2s
  option http-buffer-request
  retries 3
  option redispatch 1
  retry-on conn-failure empty-response 503
frontend perch
  bind 127.0.0.1:${port}
  # Every node full or draining: requests still reach a live node, which answers offers 503 itself.
  use_backend any if { nbsrv(nodes) eq 0 }
  default_backend nodes
${backend("any", "/healthz", nodes)}${backend("nodes", "/readyz", nodes)}`;
}

/** HAProxy on `port` in front of `nodes` (its configuration written in `dir`); its errors go to `stderr`. */
export function startHaproxy(dir: string, port: number, nodes: Array<[string, number]>, stderr: "inherit" | "pipe" = "inherit"): ChildProcess {
  const cfg = join(dir, "haproxy.cfg");
  writeFileSync(cfg, haproxyConfig(port, nodes));
  const proxy = spawn("haproxy", ["-db", "-f", cfg], { stdio: ["ignore", "ignore", stderr] });
  process.once("exit", () => proxy.kill("SIGKILL"));
  return proxy;
}
