/** The configuration file's keys: snake_case is the documented case; camelCase is read for a release, each key named in a warning. */
import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { configWarnings, loadConfig } from "../src/config/config.ts";
import { CONFIGURATION_DOC, configurationMarkdown, undescribed } from "../src/config/docs.ts";
import { SETTINGS } from "../src/config/settings.ts";
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
  assert.equal(config.data_dir, "/srv/perch");
  assert.equal(config.node_name, "edge-1");
  assert.equal(config.log_level, "warn");
  assert.deepEqual(config.trust_proxy, ["loopback"]);
  assert.equal(config.rate_limits.login_per_key, 5);
  assert.equal(config.rate_limits.offer_per_key, 7);
  assert.equal(config.http.request_timeout_ms, 1234);
  assert.equal(config.webrtc.udp_port, 40000);
  assert.equal(config.webrtc.liveness_quiet_ms, 3000);
  assert.equal(config.telemetry.retention_days, 7);
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
  assert.equal(config.data_dir, "/srv/old");
  assert.equal(config.rate_limits.login_per_key, 3);
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

test("every setting outside a list has a variable derived from its key; today's names still work as aliases, the derived name wins", () => {
  const derived = loadConfig({
    PERCH_HTTP_REQUEST_TIMEOUT_MS: "1234",
    PERCH_WEBRTC_ENABLED: "false",
    PERCH_LIMITS_KEY_CACHE_SIZE: "7",
    PERCH_VOICE_TURN_SILENCE_MS: "600",
    PERCH_VOICE_BARGE_IN: "false",
    PERCH_TELEMETRY_RETENTION_DAYS: "1.5",
    PERCH_RATE_LIMITS_OFFER_PER_KEY: "0",
  });
  assert.equal(derived.http.request_timeout_ms, 1234);
  assert.equal(derived.webrtc.enabled, false);
  assert.equal(derived.limits.key_cache_size, 7);
  assert.equal(derived.voice.turn.silence_ms, 600);
  assert.equal(derived.voice.barge_in, false);
  assert.equal(derived.telemetry.retention_days, 1.5);
  assert.equal(derived.rate_limits.offer_per_key, 0);

  // The 23 variables of earlier releases, each still setting what it set.
  const old = loadConfig({
    PERCH_PORT: "9001",
    PERCH_HOST: "127.0.0.1",
    PERCH_DATA_DIR: "/srv/d",
    PERCH_DATABASE_URL: "postgres://db/perch",
    PERCH_SERVER_KEY_FILE: "/srv/k",
    PERCH_PUBLIC_ENDPOINT: "perch.example:443",
    PERCH_NODE_NAME: "n1",
    PERCH_APP_TILE_URL: "https://tiles.example.org/{z}/{x}/{y}.png",
    PERCH_LOG_LEVEL: "warn",
    PERCH_TRUST_PROXY: "loopback,10.0.0.0/8",
    PERCH_REGISTRATION_POLICY: "token",
    PERCH_REGISTRATION_TOKENS: "a,b",
    PERCH_WEBRTC_UDP_PORT: "40001",
    PERCH_WEBRTC_MAX_CONNECTIONS: "12",
    PERCH_VOICE_STORE_TRANSCRIPTS: "true",
    PERCH_MAX_AUDIO_SECONDS: "30",
    PERCH_TELEMETRY_BUFFER_SAMPLES: "99",
    PERCH_TELEMETRY_WRITE_INTERVAL_MS: "98",
    PERCH_WRITE_TIMEOUT_MS: "97",
    PERCH_MAX_QUEUE_WAIT_MS: "96",
    PERCH_RECOGNISER_PROCESSES: "3",
    PERCH_FAST_RECOGNITION_AFTER_MS: "false",
  });
  assert.deepEqual(
    [old.port, old.host, old.data_dir, old.database_url, old.server_key_file, old.public_endpoint, old.node_name, old.app.tile_url, old.log_level],
    [9001, "127.0.0.1", "/srv/d", "postgres://db/perch", "/srv/k", "perch.example:443", "n1", "https://tiles.example.org/{z}/{x}/{y}.png", "warn"],
  );
  assert.deepEqual(old.trust_proxy, ["loopback", "10.0.0.0/8"]);
  assert.deepEqual(old.registration, { policy: "token", tokens: ["a", "b"] });
  assert.deepEqual([old.webrtc.udp_port, old.webrtc.max_connections, old.voice.store_transcripts], [40001, 12, true]);
  assert.deepEqual([old.compat.max_audio_seconds, old.compat.write_timeout_ms, old.compat.max_queue_wait_ms], [30, 97, 96]);
  assert.deepEqual([old.telemetry.buffer_samples, old.telemetry.write_interval_ms], [99, 98]);
  assert.deepEqual([old.engines.recogniser_processes, old.engines.fast_recognition_after_ms], [3, false]);
  assert.equal(loadConfig({ PERCH_VOICE_AGENT: "" }).voice.agent, undefined);

  const both = loadConfig({ PERCH_MAX_AUDIO_SECONDS: "30", PERCH_COMPAT_MAX_AUDIO_SECONDS: "40" });
  assert.equal(both.compat.max_audio_seconds, 40);
  // The variable beats the file.
  const dir = tempDir();
  try {
    writeFileSync(join(dir, "perch.yaml"), "voice: { turn: { silence_ms: 500, max_ms: 9000 } }\n");
    const config = loadConfig({ PERCH_CONFIG: join(dir, "perch.yaml"), PERCH_VOICE_TURN_SILENCE_MS: "700" });
    assert.deepEqual([config.voice.turn.min_speech_ms, config.voice.turn.silence_ms, config.voice.turn.max_ms], [200, 700, 9000]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a variable's bad value is refused naming the setting and the variable", () => {
  assert.throws(() => loadConfig({ PERCH_WEBRTC_UDP_PORT: "abc" }), /invalid configuration at webrtc\.udp_port \(PERCH_WEBRTC_UDP_PORT=abc\): /);
  assert.throws(() => loadConfig({ PERCH_VOICE_STORE_TRANSCRIPTS: "yes please" }), /voice\.store_transcripts \(PERCH_VOICE_STORE_TRANSCRIPTS=yes please\)/);
  assert.throws(() => loadConfig({ PERCH_WRITE_TIMEOUT_MS: "0" }), /compat\.write_timeout_ms \(PERCH_WRITE_TIMEOUT_MS=0\)/);
});

test("an unknown key names the nearest valid key, at any level; a key near none is refused without a guess", () => {
  assert.throws(
    () => fromFile("voice: { store_transcript: true }"),
    (err: Error) => err.message === 'invalid configuration at voice: Unrecognized key: "store_transcript" (did you mean store_transcripts?)',
  );
  assert.throws(() => fromFile("prot: 8080"), /Unrecognized key: "prot" \(did you mean port\?\)/);
  // Two edits with the transposition (r and o swapped, x added), three without it.
  assert.throws(() => fromFile("protx: 8080"), /Unrecognized key: "protx" \(did you mean port\?\)/);
  assert.throws(() => fromFile("webrtc: { udp_prot: 1 }"), /did you mean udp_port\?/);
  assert.throws(
    () => fromFile("providers: [{ id: p, kind: openai, api_key_evn: KEY }]"),
    /invalid configuration at providers\.0: Unrecognized key: "api_key_evn" \(did you mean api_key_env\?\)/,
  );
  assert.throws(() => fromFile("voice: { turn: { silenceMs: 300, maxx_ms: 1000 } }"), /did you mean max_ms\?/);
  assert.throws(
    () => loadConfig({}, { rate_limits: { loginPerKey: 0, login_per_adress: 0, zzz: 1 } } as never),
    /Unrecognized keys: "loginPerKey", "login_per_adress", "zzz" \(did you mean login_per_key for loginPerKey, login_per_address for login_per_adress\?\)/,
  );
  assert.throws(
    () => fromFile("completely_different: 1"),
    (err: Error) => err.message === 'invalid configuration at (root): Unrecognized key: "completely_different"',
  );
});

test("docs/configuration.md is the schema's: every setting described, the file as `npm run -s docs:config` writes it", () => {
  assert.deepEqual(undescribed(), [], "each of these needs .meta({ description }) in src/config/schema.ts");
  const onDisk = readFileSync(join(import.meta.dirname, "..", CONFIGURATION_DOC), "utf8");
  assert.ok(onDisk === configurationMarkdown(), `${CONFIGURATION_DOC} is stale: run npm run -s docs:config`);
  // Every variable the loader reads is in it, and a setting in a list has none.
  for (const s of SETTINGS) if (s.env) assert.ok(onDisk.includes(`\`${s.env}\``), s.env);
  assert.ok(SETTINGS.some((s) => s.key === "providers[].api_key_env" && s.env === undefined));
});
