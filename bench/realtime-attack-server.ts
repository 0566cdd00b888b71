/**
 * A hostile realtime provider for `npm run bench -- realtime-attack`, in a process of its own (its
 * sending costs the bench's event loop nothing): a WebSocket server on 127.0.0.1 that accepts the
 * session, starts a turn and a response, and then floods as the `?attack=` of the URL says.
 * Prints its port on stdout.
 */
import { WebSocketServer } from "ws";

const wss = new WebSocketServer({ host: "127.0.0.1", port: 0, perMessageDeflate: false });
wss.on("connection", (ws, req) => {
  const attack = new URL(req.url ?? "/", "http://x").searchParams.get("attack") ?? "";
  const send = (e: Record<string, unknown>) => ws.send(JSON.stringify(e));
  const drained = () => new Promise<void>((r) => (ws.bufferedAmount < 1 << 20 ? r() : setTimeout(() => r(), 2)));
  ws.once("message", async () => {
    send({ type: "session.updated", session: {} });
    send({ type: "input_audio_buffer.speech_started", item_id: "in_1" });
    send({ type: "input_audio_buffer.speech_stopped", item_id: "in_1" });
    send({ type: "response.created", response: { id: "r1" } });
    const base = { response_id: "r1" };
    const audio = Buffer.alloc(96, 1).toString("base64");
    const flood = async (n: number, event: (i: number) => Record<string, unknown>) => {
      for (let i = 0; i < n && ws.readyState === ws.OPEN; i++) {
        ws.send(JSON.stringify(event(i)));
        if (i % 200 === 0) await drained();
      }
    };
    if (attack === "audio-item-ids") await flood(200_000, (i) => ({ type: "response.output_audio.delta", ...base, item_id: `it_${i}`, delta: audio }));
    else if (attack === "transcript-item-ids")
      await flood(100_000, (i) => ({ type: "response.output_audio_transcript.delta", ...base, item_id: `tx_${i}`, delta: "word " }));
    else if (attack === "audio-one-item") await flood(200_000, () => ({ type: "response.output_audio.delta", ...base, item_id: "it", delta: audio }));
    else if (attack === "transcript-100mb") {
      const mb = "x".repeat(1 << 20);
      await flood(100, () => ({ type: "response.output_audio_transcript.delta", ...base, item_id: "it", delta: mb }));
    } else if (attack === "tool-arguments") {
      const args = JSON.stringify({ text: "y".repeat(3_900_000) });
      await flood(5, (i) => ({
        type: "response.function_call_arguments.done",
        ...base,
        item_id: `fc_${i}`,
        call_id: `c_${i}`,
        name: "device.x",
        arguments: args,
      }));
    }
    send({ type: "response.done", response: { id: "r1", status: "completed" } });
    // The end of the attack: the session closed (the realtime session says so, and reconnects).
    setTimeout(() => ws.close(1000), 200);
  });
});
wss.on("listening", () => process.stdout.write(`${(wss.address() as { port: number }).port}\n`));
