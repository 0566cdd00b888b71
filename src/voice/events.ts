import { create, toBinary } from "@bufbuild/protobuf";
import { PeerEventSchema, PeerEventType, StreamKind } from "../protocol/gen/event_pb.ts";
import type { AudioPort } from "./port.ts";

export type Kind = "text" | "audio";
export interface EventFailure {
  code: "interrupted" | "failed";
  message?: string;
}

const KIND = { text: StreamKind.TEXT, audio: StreamKind.AUDIO } as const;

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

  delta(streamId: string, label: string, text: string): void {
    this.port.sendEvent((sequence, timestampUnixMs) =>
      toBinary(
        PeerEventSchema,
        create(PeerEventSchema, {
          version: 1,
          type: PeerEventType.TEXT_DELTA,
          payload: { case: "textDelta", value: { streamId, sequence, timestampUnixMs, label, text } },
        }),
      ),
    );
  }

  done(streamId: string, label: string, text: string): void {
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
