import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { ConfigError, loadConfig } from "../src/config/config.ts";
import { defaultRecogniserProcesses } from "../src/node/recogniser-processes.ts";
import { tempDir } from "./support/server.ts";

const HASH = "a".repeat(64);
const provider = { id: "upstream", kind: "openai-compatible", base_url: "http://127.0.0.1:11434/v1", api_key_env: "UPSTREAM_KEY" };
const model = { id: "my-chat", kind: "chat", provider: "upstream", upstream_model: "llama3.2" };

function refused(input: Record<string, unknown>, field: string): void {
  assert.throws(
    () => loadConfig({}, input as never),
    (err: unknown) => err instanceof ConfigError && err.message.includes(`at ${field}:`),
    `expected a refusal naming ${field}`,
  );
}

test("the issue's YAML example loads, with defaults", () => {
  const dir = tempDir();
  const file = join(dir, "perch.yaml");
  writeFileSync(
    file,
    `providers:
  - { id: upstream, kind: openai-compatible, base_url: http://127.0.0.1:11434/v1, api_key_env: UPSTREAM_KEY, timeout_ms: 60000, max_retries: 2 }
  - { id: other, kind: anthropic, api_key_env: ANTHROPIC_KEY }
models:
  - { id: my-chat, kind: chat, provider: upstream, upstream_model: llama3.2, fallbacks: [other-chat] }
  - { id: other-chat, kind: chat, provider: other, upstream_model: claude-x }
agents:
  - { id: helper, model: my-chat, instructions: "You are the assistant of a small device.", tools: [device_status, device_runtime, device_telemetry, contacts_list], max_steps: 4 }
api_keys:
  - { name: app, sha256: ${HASH.toUpperCase()}, models: ["*"] }
`,
  );
  const config = loadConfig({ PERCH_CONFIG: file });
  assert.equal(config.providers[0]?.timeout_ms, 60_000);
  assert.equal(config.providers[1]?.max_retries, 2);
  assert.deepEqual(config.models[0]?.fallbacks, ["other-chat"]);
  assert.equal(config.agents[0]?.max_steps, 4);
  assert.equal(config.api_keys[0]?.sha256, HASH);
  assert.equal(config.api_keys[0]?.rate_limit, 0);
});

test("invalid catalogs stop start-up with a message naming the field", () => {
  refused({ providers: [provider], models: [{ ...model, provider: "nope" }] }, "models.0.provider");
  refused({ providers: [provider], models: [{ ...model, fallbacks: ["ghost"] }] }, "models.0.fallbacks.0");
  refused({ providers: [provider], models: [{ ...model, fallbacks: ["my-chat"] }] }, "models.0.fallbacks.0");
  refused({ providers: [{ id: "c", kind: "anthropic" }], models: [{ ...model, kind: "speech", provider: "c" }] }, "models.0.provider");
  refused({ providers: [provider], models: [model, { ...model, id: "tts", kind: "speech", fallbacks: ["my-chat"] }] }, "models.1.fallbacks.0");
  refused({ providers: [provider], models: [model], agents: [{ id: "a", model: "my-chat", tools: ["rm_rf"] }] }, "agents.0.tools.0");
  refused({ providers: [provider], models: [model], agents: [{ id: "a", model: "ghost" }] }, "agents.0.model");
  refused({ providers: [provider], models: [model], agents: [{ id: "my-chat", model: "my-chat" }] }, "agents.0.id");
  refused({ providers: [{ ...provider, base_url: undefined }] }, "providers.0.base_url");
  refused({ providers: [{ ...provider, kind: "mystery" }] }, "providers.0.kind");
  refused({ providers: [provider, provider] }, "providers.1.id");
  refused({ providers: [provider], models: [model, model] }, "models.1.id");
  refused({ api_keys: [{ name: "k", sha256: "not-hex" }] }, "api_keys.0.sha256");
  refused({ api_keys: [{ name: "k", sha256: HASH, models: ["ghost"] }] }, "api_keys.0.models.0");
  refused({ providers: [{ ...provider, api_key: "sk-inline" }] }, "providers.0");
});

test("engines.recogniser_processes: unset by default (the machine decides), from PERCH_RECOGNISER_PROCESSES, and 1–16 only", () => {
  assert.equal(loadConfig({}).engines.recogniser_processes, undefined);
  assert.equal(loadConfig({ PERCH_RECOGNISER_PROCESSES: "2" }).engines.recogniser_processes, 2);
  assert.equal(loadConfig({ PERCH_RECOGNISER_PROCESSES: "1" }).engines.recogniser_processes, 1);
  for (const bad of ["0", "17", "1.5", "two"]) assert.throws(() => loadConfig({ PERCH_RECOGNISER_PROCESSES: bad }), ConfigError, bad);
});

test("without a configured count, two recogniser processes on a machine with 2 cores and 4 GiB, else one", () => {
  const GiB = 1024 ** 3;
  assert.equal(defaultRecogniserProcesses({ cores: 2, memoryBytes: 4 * GiB }), 2);
  assert.equal(defaultRecogniserProcesses({ cores: 16, memoryBytes: 64 * GiB }), 2);
  assert.equal(defaultRecogniserProcesses({ cores: 1, memoryBytes: 64 * GiB }), 1);
  assert.equal(defaultRecogniserProcesses({ cores: 2, memoryBytes: 4 * GiB - 1 }), 1);
  assert.equal(defaultRecogniserProcesses({ cores: 4, memoryBytes: 2 * GiB }), 1);
});

test("engines.fast_recognition_after_ms: 600 by default, false or 1–60000 ms, from PERCH_FAST_RECOGNITION_AFTER_MS", () => {
  assert.equal(loadConfig({}).engines.fast_recognition_after_ms, 600);
  assert.equal(loadConfig({ PERCH_FAST_RECOGNITION_AFTER_MS: "false" }).engines.fast_recognition_after_ms, false);
  assert.equal(loadConfig({ PERCH_FAST_RECOGNITION_AFTER_MS: "900" }).engines.fast_recognition_after_ms, 900);
  for (const bad of ["0", "60001", "true", "soon"]) assert.throws(() => loadConfig({ PERCH_FAST_RECOGNITION_AFTER_MS: bad }), ConfigError, bad);
});
