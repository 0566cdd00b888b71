import type { Duplex } from "node:stream";
import { serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { type JSONRPCMessage, JSONRPCMessageSchema } from "@modelcontextprotocol/sdk/types.js";

/** A line longer than this closes the stream (tools.md §1). */
export const MAX_LINE_BYTES = 1024 * 1024;
/** Written bytes the other side has not taken beyond which it is taken as not reading, and the stream is closed. */
const MAX_UNSENT_BYTES = 4 * 1024 * 1024;

/**
 * MCP over a byte stream, framed as the SDK's stdio transport frames it (one JSON-RPC message per
 * line, `serializeMessage`), with the contract's bounds instead of stdio's 10 MiB buffer: a line
 * over 1 MiB, a line that is not JSON-RPC, or a peer that does not read closes the stream. Used on
 * both ends of service stream 3 (Perch's client, the device SDK's server).
 */
export class LineTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;
  /** Why the stream was closed by this side, when the other side broke the framing. */
  violation: string | undefined;
  private readonly stream: Duplex;
  private parts: Buffer[] = [];
  private partBytes = 0;
  private closed = false;

  constructor(stream: Duplex) {
    this.stream = stream;
  }

  async start(): Promise<void> {
    this.stream.on("data", (chunk: Buffer) => this.received(chunk));
    this.stream.once("end", () => void this.close());
    this.stream.once("close", () => void this.close());
    this.stream.on("error", () => void this.close());
  }

  private received(chunk: Buffer): void {
    let start = 0;
    while (!this.closed) {
      const nl = chunk.indexOf(10, start);
      if (nl === -1) break;
      const piece = chunk.subarray(start, nl);
      start = nl + 1;
      if (this.partBytes + piece.length > MAX_LINE_BYTES) {
        this.violate("a line over 1 MiB");
        return;
      }
      const line = this.parts.length ? Buffer.concat([...this.parts, piece]) : piece;
      this.parts = [];
      this.partBytes = 0;
      this.line(line);
    }
    if (this.closed || start >= chunk.length) return;
    const rest = chunk.subarray(start);
    if (this.partBytes + rest.length > MAX_LINE_BYTES) {
      this.violate("a line over 1 MiB");
      return;
    }
    this.parts.push(rest);
    this.partBytes += rest.length;
  }

  private line(bytes: Buffer): void {
    const text = bytes.toString("utf8").replace(/\r$/, "");
    if (!text.trim()) return;
    let message: JSONRPCMessage;
    try {
      message = JSONRPCMessageSchema.parse(JSON.parse(text));
    } catch {
      this.violate("a line that is not a JSON-RPC message");
      return;
    }
    try {
      this.onmessage?.(message);
    } catch (err) {
      this.onerror?.(err as Error);
    }
  }

  private violate(reason: string): void {
    this.violation ??= reason;
    this.onerror?.(new Error(reason));
    void this.close();
  }

  async send(message: JSONRPCMessage): Promise<void> {
    if (this.closed) throw new Error("the stream is closed");
    if (this.stream.writableLength > MAX_UNSENT_BYTES) {
      this.violate("the other side does not read what is sent");
      throw new Error("the stream is closed");
    }
    this.stream.write(serializeMessage(message));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.parts = [];
    this.stream.destroy();
    this.onclose?.();
  }
}
