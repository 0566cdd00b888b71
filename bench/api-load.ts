/**
 * Compatible API load for the mixed phases of `bench voice` and `bench speech`: clients that loop
 * on long speech or on file transcription, clients that never read, and a timed short request.
 */
import net from "node:net";

/** 4,096 characters of plain English (the contract's longest speech input). */
export const LONG_TEXT = "The small device reports its battery level, its temperature and its location to the server every single minute. "
  .repeat(40)
  .slice(0, 4096);

export interface LoopReport {
  /** Answers that ended whole (200 and every byte read). */
  completed: number;
  /** Answers refused with 429. */
  refused: number;
  /** Other statuses and broken answers. */
  failed: number;
}

/** Clients that each repeat `request` until `stop()`, which aborts what is in flight and reports. */
export function loop(clients: number, request: (signal: AbortSignal) => Promise<Response>): { stop(): Promise<LoopReport> } {
  const abort = new AbortController();
  const report: LoopReport = { completed: 0, refused: 0, failed: 0 };
  const running = Array.from({ length: clients }, async () => {
    while (!abort.signal.aborted) {
      try {
        const res = await request(abort.signal);
        if (res.status === 429) {
          report.refused++;
          await res.body?.cancel();
          await new Promise((r) => setTimeout(r, 1000 * Number(res.headers.get("retry-after") ?? 1)));
          continue;
        }
        if (res.status !== 200) {
          report.failed++;
          await res.body?.cancel();
          continue;
        }
        await res.arrayBuffer();
        report.completed++;
      } catch {
        if (!abort.signal.aborted) report.failed++;
      }
    }
  });
  return {
    stop: async () => {
      abort.abort();
      await Promise.all(running);
      return report;
    },
  };
}

export function speechRequest(url: string, key: string, input: string, signal?: AbortSignal): Promise<Response> {
  return fetch(`${url}/openai/v1/audio/speech`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "tts-1", input, voice: "alloy" }),
    ...(signal ? { signal } : {}),
  });
}

export function transcriptionRequest(url: string, key: string, wav: Uint8Array, signal?: AbortSignal): Promise<Response> {
  const form = new FormData();
  form.append("model", "whisper-1");
  form.append("file", new Blob([new Uint8Array(wav)], { type: "audio/wav" }), "speech.wav");
  return fetch(`${url}/openai/v1/audio/transcriptions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}` },
    body: form,
    ...(signal ? { signal } : {}),
  });
}

/** A client that sends one long speech request and never reads a byte of the answer. */
export function nonReader(url: string, key: string): net.Socket {
  const json = JSON.stringify({ model: "tts-1", input: LONG_TEXT, voice: "alloy" });
  const { hostname, port } = new URL(url);
  const socket = net.connect(Number(port), hostname, () => {
    socket.write(
      `POST /openai/v1/audio/speech HTTP/1.1\r\nHost: ${hostname}\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(json)}\r\n\r\n${json}`,
    );
    socket.pause();
  });
  socket.on("error", () => {});
  return socket;
}

/** Milliseconds to the first byte of `"Hello there."` (undefined past `timeoutMs`), and its status. */
export async function helloFirstByte(url: string, key: string, timeoutMs = 30_000): Promise<{ ms: number | undefined; status: number }> {
  const started = performance.now();
  try {
    const res = await speechRequest(url, key, "Hello there.", AbortSignal.timeout(timeoutMs));
    if (res.status !== 200) {
      await res.body?.cancel();
      return { ms: undefined, status: res.status };
    }
    const reader = res.body!.getReader();
    await reader.read();
    const ms = performance.now() - started;
    await reader.cancel();
    return { ms, status: 200 };
  } catch {
    return { ms: undefined, status: 0 };
  }
}
