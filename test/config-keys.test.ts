/** The configuration file's keys: snake_case is the documented case; camelCase is read for a release, each key named in a warning. */
import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { configWarnings, loadConfig } from "../src/config/config.ts";
import { tempDir } from "./support/server.ts";

function fromFile(text: string, name = "perch.yaml") {
  const dir = tempDir();
  try {
    writeFileSync(join(dir, name), text);
    const config = loadConfig({ PERCH_CONFIG: join(dir, name) });
    return { config, warnings: configWarnings(config) };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("snake_case keys at every level are read, with no warning", () => {
  const { config, warnings } = fromFile(`
data_dir: /srv/perch
node_name: edge-1
log_level: warn
trust_proxy: [loopback]
rate_limits: { login_per_key: 5, offer_per_key: 7 }
http: { request_timeout_ms: 1234 }
webrtc: { udp_port: 40000, liveness_quiet_ms: 3000 }
telemetry: { retention_days: 7 }
voice: { store_transcripts: true, max_reply_chars: 500 }
providers: [{ id: p, kind: openai-compatible, base_url: "http://127.0.0.1:9/v1", timeout_ms: 100 }]
models: [{ id: m, kind: chat, provider: p, upstream_model: u }]
`);
  assert.deepEqual(warnings, []);
  assert.equal(config.dataDir, "/srv/perch");
  assert.equal(config.nodeName, "edge-1");
  assert.equal(config.logLevel, "warn");
  assert.deepEqual(config.trustProxy, ["loopback"]);
  assert.equal(config.rateLimits.loginPerKey, 5);
  assert.equal(config.rateLimits.offerPerKey, 7);
  assert.equal(config.http.requestTimeoutMs, 1234);
  assert.equal(config.webrtc.udpPort, 40000);
  assert.equal(config.webrtc.livenessQuietMs, 3000);
  assert.equal(config.telemetry.retentionDays, 7);
  assert.equal(config.voice.store_transcripts, true);
  assert.equal(config.voice.max_reply_chars, 500);
  assert.equal(config.providers[0]?.base_url, "http://127.0.0.1:9/v1");
  assert.equal(config.providers[0]?.timeout_ms, 100);
  assert.equal(config.models[0]?.upstream_model, "u");
});

test("the old camelCase keys are still read, each named once in a warning with its snake_case name", () => {
  const { config, warnings } = fromFile(
    JSON.stringify({ dataDir: "/srv/old", rateLimits: { loginPerKey: 3 }, voice: { storeTranscripts: true } }),
    "perch.json",
  );
  assert.equal(config.dataDir, "/srv/old");
  assert.equal(config.rateLimits.loginPerKey, 3);
  assert.equal(config.voice.store_transcripts, true);
  assert.deepEqual(warnings, [
    "dataDir is read as data_dir; camelCase keys will be refused in the next release",
    "rateLimits is read as rate_limits; camelCase keys will be refused in the next release",
    "rate_limits.loginPerKey is read as rate_limits.login_per_key; camelCase keys will be refused in the next release",
    "voice.storeTranscripts is read as voice.store_transcripts; camelCase keys will be refused in the next release",
  ]);
});

test("map keys and values are left as written; an unknown key is still refused, named in snake_case", () => {
  const { config } = fromFile(`
registration: { policy: token, tokens: [Some_Token, otherToken] }
`);
  assert.deepEqual(config.registration.tokens, ["Some_Token", "otherToken"]);
  assert.throws(() => fromFile("webrtc: { udp_prot: 1 }"), /invalid configuration at webrtc/);
  assert.throws(() => fromFile("rate_limits: { login_per_key: -1 }"), /invalid configuration at rate_limits\.login_per_key/);
});
