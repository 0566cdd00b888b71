import { create, toBinary } from "@bufbuild/protobuf";
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

/** The voice contract's events (voice.md §3) on one connection's event stream. */
export class VoiceEvents {
  private readonly port: AudioPort;

  constructor(port: AudioPort) {
    this.port = port;
  }

  bos(streamId: string, kind: Kind, label: string, mimeType = ""): void {
    this.port.sendEvent((sequence, timestampUnixMs) =>
      toBinary(
        PeerEventSchema,
        create(PeerEventSchema, {
          version: 1,
          type: PeerEventType.BOS,
          payload: { case: "bos", value: { streamId, sequence, timestampUnixMs, kind: KIND[kind], label, mimeType } },
        }),
      ),
    );
  }

  eos(streamId: string, kind: Kind, label: string, error?: EventFailure): void {
    this.port.sendEvent((sequence, timestampUnixMs) =>
      toBinary(
        PeerEventSchema,
        create(PeerEventSchema, {
          version: 1,
          type: PeerEventType.EOS,
          payload: {
            case: "eos",
            value: {
              streamId,
              sequence,
              timestampUnixMs,
              kind: KIND[kind],
              label,
              ...(error ? { error: { code: error.code, message: error.message ?? "", retryable: false } } : {}),
            },
          },
        }),
      ),
    );
  }

  /** New text; a delta too large for one event goes as several (their concatenation is the same). */
  delta(streamId: string, label: string, text: string): void {
    for (const piece of textPieces(text))
      this.port.sendEvent((sequence, timestampUnixMs) =>
        toBinary(
          PeerEventSchema,
          create(PeerEventSchema, {
            version: 1,
            type: PeerEventType.TEXT_DELTA,
            payload: { case: "textDelta", value: { streamId, sequence, timestampUnixMs, label, text: piece } },
          }),
        ),
      );
  }

  /** The whole text, or its first MAX_EVENT_TEXT_BYTES when longer (the deltas carried all of it). */
  done(streamId: string, label: string, whole: string): void {
    const text = textPieces(whole)[0]!;
    this.port.sendEvent((sequence, timestampUnixMs) =>
      toBinary(
        PeerEventSchema,
        create(PeerEventSchema, {
          version: 1,
          type: PeerEventType.TEXT_DONE,
          payload: { case: "textDone", value: { streamId, sequence, timestampUnixMs, label, text } },
        }),
      ),
    );
  }
}
