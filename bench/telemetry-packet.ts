import { create, toBinary } from "@bufbuild/protobuf";
import { TelemetryFrameSchema } from "../src/protocol/gen/telemetry_pb.ts";

/** The packet channel's telemetry type byte (transport contract). */
export const TELEMETRY_PACKET = 0x40;

/** One telemetry packet: 0x40 and a `TelemetryFrame` of one battery observation (two samples). */
export function telemetryPacket(sequence: number, observedAtUnixMs: number, observations = 1): Buffer {
  const frame = create(TelemetryFrameSchema, {
    sequence,
    observedAtUnixMs: BigInt(observedAtUnixMs),
    observations: Array.from({ length: observations }, (_, i) => ({
      observedAtDeltaMs: -i * 10,
      body: { case: "battery" as const, value: { percent: 50 + (sequence % 50), charging: sequence % 2 === 0 } },
    })),
  });
  const bytes = toBinary(TelemetryFrameSchema, frame);
  const packet = Buffer.allocUnsafe(bytes.length + 1);
  packet[0] = TELEMETRY_PACKET;
  packet.set(bytes, 1);
  return packet;
}
