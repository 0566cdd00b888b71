import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { PeerEventSchema, PeerEventType, StreamKind } from "../protocol/gen/event_pb.ts";
import { splitText } from "../protocol/text.ts";
import type { AudioPort } from "./port.ts";

export type Kind = "text" | "audio";
export interface EventFailure {
  code: "interrupted" | "failed" | "overloaded";
  message?: string;
}

const KIND = { text: StreamKind.TEXT, audio: StreamKind.AUDIO } as const;

/**
 * An event is one frame of at most 65,535 bytes (transport contract §7): the text of one event
 * stays under this many bytes, the rest of the event far below the difference.
 */
export const MAX_EVENT_TEXT_BYTES = 60_000;

/** `text` in pieces of at most MAX_EVENT_TEXT_BYTES of UTF-8, cut between characters. */
export function textPieces(text: string): string[] {
  return splitText(text, MAX_EVENT_TEXT_BYTES);
}

/**
 * One voice event as the conversation tells it (voice.md §3): an object until the transport
 * numbers it, stamps its time and encodes it for the device (`encodeVoiceEvent`).
 */
export type VoiceEvent =
  | { type: "bos"; streamId: string; kind: Kind; label: string; mimeType: string }
  | { type: "eos"; streamId: string; kind: Kind; label: string; error?: EventFailure | undefined }
  | { type: "delta"; streamId: string; label: string; text: string }
  | { type: "done"; streamId: string; label: string; text: string };

/** `event` as the `PeerEvent` of the device's event stream (service 32), bytes. */
export function encodeVoiceEvent(event: VoiceEvent, sequence: bigint, timestampUnixMs: bigint): Uint8Array {
  const { streamId, label } = event;
  const at = { streamId, sequence, timestampUnixMs, label };
  return toBinary(PeerEventSchema, create(PeerEventSchema, { version: 1, ...payloadOf(event, at) }));
}

function payloadOf(
  event: VoiceEvent,
  at: { streamId: string; sequence: bigint; timestampUnixMs: bigint; label: string },
): MessageInitShape<typeof PeerEventSchema> {
  switch (event.type) {
    case "bos":
      return { type: PeerEventType.BOS, payload: { case: "bos", value: { ...at, kind: KIND[event.kind], mimeType: event.mimeType } } };
    case "eos": {
      const { error } = event;
      const failure = error ? { error: { code: error.code, message: error.message ?? "", retryable: false } } : {};
      return { type: PeerEventType.EOS, payload: { case: "eos", value: { ...at, kind: KIND[event.kind], ...failure } } };
    }
    case "delta":
      return { type: PeerEventType.TEXT_DELTA, payload: { case: "textDelta", value: { ...at, text: event.text } } };
    case "done":
      return { type: PeerEventType.TEXT_DONE, payload: { case: "textDone", value: { ...at, text: event.text } } };
  }
}

/** The voice contract's events (voice.md §3) on one connection's event stream. */
export class VoiceEvents {
  private readonly port: AudioPort;

  constructor(port: AudioPort) {
    this.port = port;
  }

  bos(streamId: string, kind: Kind, label: string, mimeType = ""): void {
    this.port.sendEvent({ type: "bos", streamId, kind, label, mimeType });
  }

  eos(streamId: string, kind: Kind, label: string, error?: EventFailure): void {
    this.port.sendEvent({ type: "eos", streamId, kind, label, error });
  }

  /** New text; a delta too large for one event goes as several (their concatenation is the same). */
  delta(streamId: string, label: string, text: string): void {
    for (const piece of textPieces(text)) this.port.sendEvent({ type: "delta", streamId, label, text: piece });
  }

  /** The whole text, or its first MAX_EVENT_TEXT_BYTES when longer (the deltas carried all of it). */
  done(streamId: string, label: string, whole: string): void {
    this.port.sendEvent({ type: "done", streamId, label, text: textPieces(whole)[0]! });
  }
}
