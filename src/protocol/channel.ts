import { Duplex } from "node:stream";

/** At most this much per DataChannel message (transport contract, section 4). */
export const MAX_MESSAGE_BYTES = 16 * 1024;
/** Writes wait while more than this is queued in the channel, and resume once it drains below the low mark. */
export const HIGH_WATER_BYTES = 1024 * 1024;
export const LOW_WATER_BYTES = 256 * 1024;
/**
 * node-datachannel delivers a channel's messages and its close through separate queues, so the
 * close can overtake the last messages: a close is passed on once none has come for this long.
 */
export const CLOSE_QUIET_MS = 15;
/** A stream's close waits this long after its last message has left, unless the other side closes first (see `ChannelStream.linger`; 50 ms was too short at load). */
export const CLOSE_LINGER_MS = 500;

export const PACKET_LABEL = "giznet/v1/packet";
export const SERVICE_PREFIX = "giznet/v1/service/";
export const SERVICE = { RPC: 0, PUBLIC_API: 1, COMPATIBLE_API: 2, TOOLS: 3, EVENTS: 32 } as const;

/** The service id of a DataChannel label, or null when it is not `giznet/v1/service/<decimal id>`. */
export function serviceId(label: string): number | null {
  if (!label.startsWith(SERVICE_PREFIX)) return null;
  const text = label.slice(SERVICE_PREFIX.length);
  if (!/^(0|[1-9][0-9]{0,9})$/.test(text)) return null;
  const id = Number(text);
  return id <= 0xffffffff ? id : null;
}

/** What a stream needs of a DataChannel, whichever WebRTC stack provides it. */
export interface ChannelPort {
  readonly label: string;
  send(data: Uint8Array): void;
  bufferedAmount(): number;
  close(): void;
  /** Called once: the port delivers messages, its closing and "buffered amount low" to `sink`. */
  attach(sink: ChannelSink): void;
}

export interface ChannelSink {
  message(data: Uint8Array): void;
  closed(): void;
  /** The buffered amount fell to the low-water mark. */
  drained(): void;
  /** What the port called failed (a listener of the stream threw): the stream ends with `err`. */
  failed(err: Error): void;
}

/**
 * A DataChannel as a byte stream: writes are cut into messages of at most 16 KiB and wait while
 * the channel's buffer is over the high-water mark; ending the writable side closes the channel
 * once what was written has left; the channel closing ends the readable side.
 */
export class ChannelStream extends Duplex {
  readonly port: ChannelPort;
  private waiting: (() => void) | undefined;
  private remoteClosed = false;

  constructor(port: ChannelPort) {
    super({ allowHalfOpen: true });
    this.port = port;
    // A channel closing under a write is an ordinary end of a stream, not a crash.
    this.on("error", () => {});
    port.attach({ message: (d) => this.received(d), closed: () => this.channelClosed(), drained: () => this.wake(), failed: (err) => this.failed(err) });
  }

  private received(data: Uint8Array): void {
    if (!this.remoteClosed) this.push(data);
  }

  private failed(err: Error): void {
    this.remoteClosed = true;
    this.wake();
    this.destroy(err);
  }

  private channelClosed(): void {
    if (this.remoteClosed) return;
    this.remoteClosed = true;
    this.push(null);
    this.wake();
    // Nothing written can arrive any more: the stream is over.
    if (!this.writableFinished) this.destroy();
  }

  private wake(): void {
    const w = this.waiting;
    this.waiting = undefined;
    w?.();
  }

  private room(): Promise<void> {
    return new Promise((resolve) => {
      this.waiting = resolve;
    });
  }

  override _read(): void {}

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.send(chunk).then(() => callback(), callback);
  }

  override _writev(chunks: Array<{ chunk: Buffer }>, callback: (error?: Error | null) => void): void {
    this.send(Buffer.concat(chunks.map((c) => c.chunk))).then(() => callback(), callback);
  }

  private async send(data: Buffer): Promise<void> {
    for (let offset = 0; offset < data.length; offset += MAX_MESSAGE_BYTES) {
      if (this.remoteClosed) throw new Error("the channel is closed");
      while (this.port.bufferedAmount() > HIGH_WATER_BYTES) {
        await this.room();
        if (this.remoteClosed) throw new Error("the channel is closed");
      }
      this.port.send(data.subarray(offset, offset + MAX_MESSAGE_BYTES));
    }
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.flushed()
      .then(() => this.linger())
      .then(() => {
        try {
          this.port.close();
        } catch {}
        callback();
      }, callback);
  }

  /**
   * A moment before the close, unless the other side closes first: a close sent right after the
   * last message can make a node-datachannel receiver drop that message (its stream reset handled
   * first), as an HTTP stream's answer was.
   */
  private linger(): Promise<void> {
    if (this.remoteClosed) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, CLOSE_LINGER_MS);
      this.once("end", done);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
    });
  }

  /** Resolves once the channel has handed everything to the transport (or closed). */
  private async flushed(): Promise<void> {
    while (!this.remoteClosed && this.port.bufferedAmount() > 0) await new Promise((r) => setTimeout(r, 5));
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.wake();
    if (!this.remoteClosed) {
      this.remoteClosed = true;
      this.port.close();
    }
    callback(error);
  }
}
