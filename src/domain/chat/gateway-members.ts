/**
 * The members only the gateway writes (`x_gateway`, its charge) and the framing only it sends
 * (`[DONE]`), kept out of what a provider's answer hands the client (DESIGN.md 10: only the
 * gateway speaks for the gateway).
 */

/**
 * A provider chunk with a top-level `x_gateway` member: where the gateway writes its own charge
 * (the last chunk before `[DONE]`). Dropped whole, as if never sent (not metered, its usage not
 * read): a provider must not be able to tell a client what it was charged (DESIGN.md 8). Costs
 * one property lookup on the chunk the relay parses anyway.
 */
export function ownsGatewayMember(chunk: unknown): boolean {
  return typeof chunk === "object" && chunk !== null && Object.hasOwn(chunk, "x_gateway");
}

/**
 * Data that is not JSON and holds `[DONE]` or `x_gateway` anywhere: dropped. A standard SSE
 * parser reads it as one event (the REST writer frames every line of it), but the official
 * openai SDK ends a stream on any data that starts with `[DONE]`, and a client that reads SSE
 * line by line would take one of its lines for the gateway's `[DONE]` or final chunk. Only
 * reached when the chunk did not parse (never on the hot path). Valid JSON cannot do either:
 * no line of a JSON text starts with `[DONE]`, and a member is checked above.
 */
export function mimicsGatewayFraming(data: string): boolean {
  return data.includes("[DONE]") || data.includes("x_gateway");
}

/**
 * Removes the members only the gateway writes (`x_gateway`) from a provider's JSON answer
 * (DESIGN.md 10: only the gateway speaks for the gateway). Whether any was there.
 */
export function dropGatewayMembers(body: unknown): boolean {
  if (typeof body !== "object" || body === null || !Object.hasOwn(body, "x_gateway")) return false;
  delete (body as Record<string, unknown>)["x_gateway"];
  return true;
}
