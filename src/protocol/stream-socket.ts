import type { AddressInfo } from "node:net";
import { type ChannelPort, ChannelStream } from "./channel.ts";

/**
 * A DataChannel stream as the socket Node's `http` (server and client) and `@hono/node-server`
 * use: everything they call on a `net.Socket` is here, with `net.Socket`'s meaning where a
 * DataChannel can have it (an idle timeout, a graceful close) and as a harmless no-op where it
 * cannot (Nagle, TCP keep-alive, holding the event loop open: the peer connection does that).
 * `test/stream-socket.test.ts` checks this list against what Node and Hono touch on a real socket.
 */
export class StreamSocket extends ChannelStream {
  /** The device's address as the transport sees it (the selected ICE pair's remote side). */
  remoteAddress: string | undefined;
  remotePort: number | undefined;
  remoteFamily: string | undefined;
  readonly localAddress: string | undefined = undefined;
  readonly localPort: number | undefined = undefined;
  readonly localFamily: string | undefined = undefined;
  readonly connecting = false;
  readonly pending = false;
  /** The idle timeout set by `setTimeout`, in milliseconds (undefined when none). */
  timeout: number | undefined;
  bytesRead = 0;
  private written = 0;
  private idle: NodeJS.Timeout | undefined;

  constructor(port: ChannelPort) {
    super(port);
    this.on("data", (chunk: Buffer) => {
      this.bytesRead += chunk.length;
    });
    this.once("close", () => this.clearIdle());
  }

  get bytesWritten(): number {
    return this.written;
  }

  get readyState(): "open" | "readOnly" | "writeOnly" | "closed" {
    if (this.destroyed) return "closed";
    if (this.readable && this.writable) return "open";
    return this.readable ? "readOnly" : this.writable ? "writeOnly" : "closed";
  }

  /** `net.Socket.setTimeout`: `timeout` once nothing was read or written for `ms` (0 turns it off). */
  setTimeout(ms: number, callback?: () => void): this {
    this.clearIdle();
    this.timeout = ms > 0 ? ms : undefined;
    if (callback) {
      if (ms > 0) this.once("timeout", callback);
      else this.removeListener("timeout", callback);
    }
    if (ms > 0 && !this.destroyed) {
      this.idle = setTimeout(() => {
        this.idle = undefined;
        // A listener's failure must end this stream, not the process (the timer has no caller to catch it).
        try {
          this.emit("timeout");
        } catch (err) {
          this.destroy(err as Error);
        }
      }, ms);
      this.idle.unref();
    }
    return this;
  }

  private clearIdle(): void {
    if (this.idle) clearTimeout(this.idle);
    this.idle = undefined;
  }

  private touched(): void {
    this.idle?.refresh();
  }

  override push(chunk: unknown, encoding?: BufferEncoding): boolean {
    if (chunk !== null) this.touched();
    return super.push(chunk, encoding);
  }

  override _write(chunk: Buffer, encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.written += chunk.length;
    this.touched();
    super._write(chunk, encoding, callback);
  }

  override _writev(chunks: Array<{ chunk: Buffer }>, callback: (error?: Error | null) => void): void {
    for (const c of chunks) this.written += c.chunk.length;
    this.touched();
    super._writev(chunks, callback);
  }

  setNoDelay(): this {
    return this;
  }

  setKeepAlive(): this {
    return this;
  }

  ref(): this {
    return this;
  }

  unref(): this {
    return this;
  }

  /** The local address: a DataChannel has none of its own (`net.Socket` answers `{}` without a handle). */
  address(): AddressInfo | Record<string, never> {
    return {};
  }

  /**
   * `net.Socket.destroySoon`: ends the writable side, and destroys the stream once what was
   * written has been handed on. `@hono/node-server` calls it from a timer when the rest of a
   * request body is not read in time; without it the process died.
   */
  destroySoon(): void {
    if (this.writable) this.end();
    if (this.writableFinished) this.destroy();
    else this.once("finish", () => this.destroy());
  }

  /** `net.Socket.resetAndDestroy`: a DataChannel has no reset to send; it is closed at once. */
  resetAndDestroy(): this {
    return this.destroy();
  }
}
