import type { OpusRate } from "../audio/opus.ts";

/**
 * The messages between the main thread and an audio thread (src/voice/audio-threads.ts,
 * src/voice/audio-worker.ts). Few and batched: the main thread posts the packets that arrived in
 * one turn of its event loop as one buffer (transferred, not copied again), and the thread posts
 * what it decoded in one turn of its own as one buffer of samples and a flat list of items.
 */
export type ToAudioThread =
  | { t: "open"; id: number; payloadType: number; audioLevelId: number | undefined; rate: OpusRate; hangoverMs: number | undefined }
  | { t: "close"; id: number }
  /**
   * What came in one turn of the main thread's event loop. `rtp`: packets, each as the
   * conversation's id (u32), the packet's length (u16) and its bytes; `frames`: reply frames to
   * encode, each as the conversation's id (u32) and FRAME_SAMPLES samples (48 kHz).
   */
  | { t: "in"; rtp: ArrayBuffer | undefined; frames: ArrayBuffer | undefined }
  /** The heartbeat: answered at once with an empty `out` (a thread that does not answer is stuck). */
  | { t: "ping" };

export interface FromAudioThread {
  t: "out";
  /** The samples of the `pcm` items, one after another. */
  pcm: ArrayBuffer | undefined;
  /** The packets of the `opus` items, one after another. */
  opus: ArrayBuffer | undefined;
  /** ITEM_SIZE numbers an item: the conversation's id, the kind (OUT), and two values. */
  items: number[];
}

export const ITEM_SIZE = 4;
/**
 * What an item says: samples (offset, length in `pcm`), silence (samples), samples dropped for
 * running ahead of real time, packet counts so far (decoded, silent), or that the conversation's
 * uplink could not be made, or a reply frame's packet (offset, length in `opus`; length 0: it
 * could not be encoded), one for every frame, in order, or that the conversation is closed on the
 * thread (its last counts: decoded, silent).
 */
export const OUT = { pcm: 0, silence: 1, overrun: 2, counts: 3, failed: 4, opus: 5, closed: 6 } as const;
/** The header of a packet in an `rtp` message: id (4 bytes) and length (2). */
export const PACKET_HEADER = 6;
/** The header of a frame in a `frames` buffer: the conversation's id (4 bytes, so the samples stay aligned). */
export const FRAME_HEADER = 4;
