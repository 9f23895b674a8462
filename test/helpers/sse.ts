/** The `data:` payloads of an SSE body, in order (an event's data lines joined; `event:` lines skipped). */
export function sseData(text: string): string[] {
  return text
    .split("\n\n")
    .map((event) =>
      event
        .split("\n")
        .filter((line) => line.startsWith("data: "))
        .map((line) => line.slice("data: ".length))
        .join("\n"),
    )
    .filter((data) => data !== "");
}

/**
 * The charge a gateway stream reported: its final chunk's `x_gateway.credits_charged` when the
 * stream ended with `[DONE]`; undefined when it did not (then its last event is an error event,
 * or it was cut) or the final chunk carries no charge.
 */
export function reportedCharge(events: readonly string[]): bigint | undefined {
  if (events.at(-1) !== "[DONE]") return undefined;
  const final = JSON.parse(events.at(-2)!) as { x_gateway?: { credits_charged: string } };
  return final.x_gateway === undefined ? undefined : BigInt(final.x_gateway.credits_charged);
}
