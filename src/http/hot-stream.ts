import type { ServerResponse } from "node:http";
import { sharedHeaders } from "./exchange.ts";

/**
 * Starts a streamed answer as the app's Node adapter starts one whose headers the app gave as an
 * object of several (a web `Headers`, copied out in its order: lower-case names, sorted): the
 * shared headers on Node's response first, then those, sent at once (`flushHeaders`).
 */
export function writeStreamHead(outgoing: ServerResponse, requestId: string, headers: Record<string, string>): void {
  sharedHeaders((name, value) => void outgoing.setHeader(name, value), requestId);
  const sorted: Record<string, string> = {};
  for (const name of Object.keys(headers).sort()) sorted[name.toLowerCase()] = headers[name]!;
  outgoing.writeHead(200, sorted);
  outgoing.flushHeaders();
}

/**
 * Writes `body` to `outgoing` piece by piece as the adapter does (`writeFromReadableStream`): the
 * next piece is read once the last one is taken (or drained), the end ends the answer, and the
 * client's going away cancels the body (which ends its source).
 */
export async function pipeBody(body: ReadableStream<Uint8Array>, outgoing: ServerResponse): Promise<void> {
  const reader = body.getReader();
  const cancel = (error?: unknown) => {
    reader.cancel(error).catch(() => {});
  };
  outgoing.on("close", cancel);
  outgoing.on("error", cancel);
  try {
    if (outgoing.destroyed) return cancel();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        outgoing.end();
        return;
      }
      if (!outgoing.write(value)) {
        await new Promise<void>((resolve) => {
          const go = () => {
            outgoing.off("drain", go);
            outgoing.off("close", go);
            resolve();
          };
          outgoing.on("drain", go);
          outgoing.on("close", go);
        });
        if (outgoing.destroyed) return;
      }
    }
  } catch (err) {
    outgoing.destroy(err instanceof Error ? err : new Error(String(err)));
  } finally {
    outgoing.off("close", cancel);
    outgoing.off("error", cancel);
  }
}
