import { closeSync, openSync, rmSync, writeFileSync } from "node:fs";
import { create, toBinary } from "@bufbuild/protobuf";
import { wavFile } from "../audio/samples.ts";
import type { KeyPair } from "../crypto/keys.ts";
import { ClientGetIdentifiersResponseSchema, ClientGetInfoResponseSchema, RpcMethod, ServerPutInfoRequestSchema } from "../protocol/gen/rpc_pb.ts";
import type { RpcHandlers } from "../protocol/rpc.ts";
import { StayConnected } from "../sdk/reconnect.ts";
import { OfferError, PerchConnection } from "../sdk/webrtc.ts";
import { DEMO_TOOLS } from "./demo-tools.ts";
import type { ConnectOptions } from "./device-connect.ts";
import { unreachable } from "./unreachable.ts";

/** `perch device connect` once its options are read (see device-connect.ts). */
export async function runConnect(opts: ConnectOptions, load: () => { server: string; keyPair: KeyPair }, fail: (message: string) => never): Promise<void> {
  if (opts.replyWav && opts.say === undefined) fail("--reply-wav needs --say");
  if (opts.say !== undefined && opts.say.trim() === "") fail("--say needs something to say");
  for (const t of opts.tool) if (!DEMO_TOOLS[t]) fail(`unknown --tool ${t}; tools: ${Object.keys(DEMO_TOOLS).join(", ")}`);
  const { server, keyPair } = load();
  // Opened before the conversation, so that a file that cannot be written is said at once.
  let wavFd: number | undefined;
  let wavSaved = false;
  if (opts.replyWav) {
    const file = opts.replyWav;
    try {
      wavFd = openSync(file, "w");
    } catch (err) {
      fail(`cannot write --reply-wav ${file}: ${(err as Error).message}`);
    }
    // A turn that fails leaves no empty or partial file behind.
    process.once("exit", () => {
      if (!wavSaved) rmSync(file, { force: true });
    });
  }
  const say = (what: string, detail: Record<string, unknown> = {}) =>
    process.stdout.write(`${new Date().toISOString()} ${what}${Object.keys(detail).length ? ` ${JSON.stringify(detail)}` : ""}\n`);
  const handlers: RpcHandlers = {};
  if (opts.manufacturer || opts.model || opts.hardwareRevision) {
    handlers[RpcMethod.CLIENT_INFO_GET] = () => {
      say("rpc client.info.get answered");
      const value = { manufacturer: opts.manufacturer, model: opts.model, hardwareRevision: opts.hardwareRevision };
      return { payload: toBinary(ClientGetInfoResponseSchema, create(ClientGetInfoResponseSchema, { value })) };
    };
  }
  if (opts.sn) {
    handlers[RpcMethod.CLIENT_IDENTIFIERS_GET] = () => {
      say("rpc client.identifiers.get answered");
      return { payload: toBinary(ClientGetIdentifiersResponseSchema, create(ClientGetIdentifiersResponseSchema, { value: { sn: opts.sn } })) };
    };
  }
  const registrationToken = process.env.PERCH_REGISTRATION_TOKEN || undefined;
  /** What each new connection is given: its name and emoji, its tools; it says it is connected and who it is. */
  const setUp = async (conn: PerchConnection) => {
    say("connected", { public_key: conn.publicKey, ready_ms: Math.round(conn.timings.ready), server_timing: conn.timings.serverTiming });
    say("ping", { rtt_ms: Math.round((await conn.ping()).rttMs * 10) / 10 });
    if (opts.name !== undefined || opts.emoji !== undefined) {
      const value = { ...(opts.name !== undefined ? { name: opts.name } : {}), ...(opts.emoji !== undefined ? { emoji: opts.emoji } : {}) };
      await conn.call(RpcMethod.SERVER_INFO_PUT, toBinary(ServerPutInfoRequestSchema, create(ServerPutInfoRequestSchema, { value })));
      say("server.info.put", value);
    }
    if (opts.tool.length) {
      // The status document is replaced whole: what it holds now is kept beside the tool's change.
      const report = async (patch: Record<string, unknown>) => {
        const now = await conn.http(1, "GET", "/me/status");
        const current = now.status === 200 ? (now.json() as Record<string, unknown>) : {};
        const body = JSON.stringify({ ...current, ...patch, reported_at: new Date().toISOString() });
        const res = await conn.http(1, "PUT", "/me/status", { body, headers: { "content-type": "application/json" } });
        if (res.status !== 200) throw new Error(`PUT /me/status answered ${res.status}`);
      };
      const tools = opts.tool.flatMap((t) => DEMO_TOOLS[t]!(say, report));
      await conn.offerTools(tools);
      say("tools offered over service 3", { tools: tools.map((t) => `device.${t.name}`) });
    }
    const me = await conn.http(1, "GET", "/me");
    say("GET /me over stream 1", { status: me.status, body: me.json() });
  };
  // The first connection must succeed (a wrong address is said at once); later ones are the
  // reconnections of fleet.md §4: after node.reconnect, a 503 or a lost connection, to the same URL.
  let first = true;
  const device = new StayConnected({
    baseUrl: server,
    keyPair,
    handlers,
    ...(registrationToken ? { registrationToken } : {}),
    connect: async (o) => {
      try {
        return await PerchConnection.connect(o);
      } catch (err) {
        if (first) fail(err instanceof OfferError ? `offer refused: ${err.message}` : unreachable(server, err));
        throw err;
      } finally {
        first = false;
      }
    },
    onConnected: setUp,
    log: (e) => {
      if (e.event === "connected" && e.after === "start") return;
      if (e.event === "attempt" && e.after === "start") return;
      const { event, ...detail } = e;
      say(event === "attempt" ? "reconnecting" : event === "connected" ? "reconnected" : event === "reconnect" ? "node.reconnect received" : event, detail);
    },
  });
  let conn: PerchConnection;
  try {
    conn = await device.connected();
  } catch (err) {
    fail(err instanceof OfferError ? `offer refused: ${err.message}` : String(err));
  }
  const seconds = Number(opts.telemetryInterval);
  let timer: NodeJS.Timeout | undefined;
  if (seconds > 0) {
    const battery = Number(opts.battery);
    const send = () => {
      const now = device.current;
      if (!now) return;
      now.sendTelemetry({
        observedAtUnixMs: BigInt(Date.now()),
        observations: [
          { observedAtDeltaMs: 0, body: { case: "battery", value: { percent: battery, charging: false } } },
          { observedAtDeltaMs: 0, body: { case: "system", value: { uptimeSeconds: process.uptime() } } },
        ],
      });
      say("telemetry sent", { battery_percent: battery });
    };
    send();
    timer = setInterval(send, seconds * 1000);
  }
  if (opts.tone) {
    const res = await conn.http(1, "POST", "/me/audio/tone", { body: "{}", headers: { "content-type": "application/json" } });
    say("tone requested", { status: res.status });
    setTimeout(() => say("audio received", { ...conn.audio }), 1500);
  }
  if (opts.say !== undefined) {
    const heard = await converse(conn, opts.say, opts.voice, say, fail);
    if (wavFd !== undefined) {
      try {
        writeFileSync(wavFd, wavFile(heard.samples, heard.rate));
        closeSync(wavFd);
        wavSaved = true;
      } catch (err) {
        fail(`cannot write --reply-wav ${opts.replyWav}: ${(err as Error).message}`);
      }
      say("reply saved", { file: opts.replyWav, seconds: Math.round((heard.samples.length / heard.rate) * 10) / 10 });
    }
    if (timer) clearInterval(timer);
    await device.close();
    process.exit(0);
  }
  process.once("SIGINT", () => {
    say("disconnecting");
    if (timer) clearInterval(timer);
    void device.close();
  });
  await device.finished();
  if (timer) clearInterval(timer);
  say("disconnected");
  if (device.error) fail(`offer refused: ${device.error.message}`);
  process.exit(0);
}

/** How long `--say` waits for the turn to finish. */
const TURN_TIMEOUT_MS = 60_000;
/**
 * How long after the question was spoken the server must have said it heard speech (`BOS
 * user.audio`, sent while the speech goes on): no agent answers this device otherwise.
 */
const HEARD_TIMEOUT_MS = 8_000;

/**
 * Speaks `text` (synthesised with `voice`) into the microphone, prints the voice events as they
 * come, and resolves with what the device heard once the turn's metrics arrive. Fails (exit 1)
 * when no agent hears the device, and when the turn failed or heard no words.
 */
async function converse(
  conn: PerchConnection,
  text: string,
  voice: string,
  say: (what: string, detail?: Record<string, unknown>) => void,
  fail: (message: string) => never,
): Promise<{ samples: Int16Array; rate: number }> {
  const { createSpeechEngine } = await import("../ai/speech/index.ts");
  const { loadResampler, Resampler } = await import("../audio/resampler.ts");
  const engine = createSpeechEngine();
  if (!engine.voices.includes(voice)) fail(`unknown voice ${voice}; voices: ${engine.voices.join(", ")}`);
  const spoken = await engine.speak(text, voice);
  const up = new Resampler(await loadResampler(), spoken.sampleRate, 48_000);
  const padded = new Int16Array(spoken.samples.length + spoken.sampleRate / 10);
  padded.set(spoken.samples);
  const pcm = up.process(padded);
  up.close();
  let heard = false;
  let failure: string | undefined;
  let spokenAt: (() => void) | undefined;
  const finished = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no reply within ${TURN_TIMEOUT_MS / 1000} s (is the agent's chat provider answering?)`)), TURN_TIMEOUT_MS);
    spokenAt = () =>
      setTimeout(() => {
        if (heard) return;
        clearTimeout(timer);
        reject(new Error("the server heard no speech: no voice agent answers this device (set voice.agent, or perch peers voice <key> <agent>)"));
      }, HEARD_TIMEOUT_MS).unref();
    conn.eventStream.on((e) => {
      const p = e.payload;
      if (!p.case) return;
      const v = p.value as { streamId: string; label: string; text?: string; error?: { code: string; message: string } };
      const detail: Record<string, unknown> = { stream: v.streamId, label: v.label };
      // The metrics and the tool events carry JSON: printed as such.
      if (v.text !== undefined) detail.text = v.label === "turn.metrics" || v.label.startsWith("tool.") ? JSON.parse(v.text) : v.text;
      if (v.error) detail.error = { code: v.error.code, message: v.error.message };
      say(`event ${p.case === "bos" ? "BOS" : p.case === "eos" ? "EOS" : p.case === "textDelta" ? "TEXT_DELTA" : "TEXT_DONE"}`, detail);
      heard = true;
      if (v.error?.code === "failed") failure ??= v.error.message || "failed";
      if (p.case === "textDone" && v.label === "user.transcript" && !v.text?.trim()) failure ??= "the server heard no words";
      if (p.case === "textDone" && v.label === "turn.metrics") {
        clearTimeout(timer);
        // The last packets are still on their way to the speaker.
        setTimeout(resolve, 300);
      }
    });
  });
  conn.speaker.record();
  const mic = await conn.microphone();
  say("speaking", { text, voice, seconds: Math.round((pcm.length / 48_000) * 10) / 10 });
  await mic.say(pcm);
  spokenAt?.();
  try {
    await finished;
  } catch (err) {
    fail((err as Error).message);
  }
  if (failure) fail(`the turn failed: ${failure}`);
  return { samples: conn.speaker.take(), rate: conn.speaker.rate };
}
