import type { Hex } from "viem";
import { afterAll, beforeAll } from "vitest";
import { startGateway, type Gateway } from "../../src/app.js";
import type { FakeUpstream } from "./fake-upstream.js";
import { secondChatOffer } from "./market.js";
import { startChatStack, type TestStack } from "./stack.js";

/** Two gateway processes on one database, serving two offers of `demo-chat`. */
export interface TwoGateways {
  readonly stack: TestStack;
  /** The second process: the stack's config and database, its own memory. */
  readonly second: Gateway;
  /** The demo chat offer (the cheaper: ranked first) and its fake provider. */
  readonly a: Hex;
  readonly fakeA: FakeUpstream;
  /** The second offer, dearer ({@link secondChatOffer}), and its fake provider. */
  readonly b: Hex;
  readonly fakeB: FakeUpstream;
}

/**
 * Starts {@link TwoGateways} before the describe block's tests and stops them after: what
 * state one process shares with the others through the database (a cooldown, an audit
 * exclusion) is seen by the process that did not write it. Call inside a `describe`; the
 * returned accessor is for the tests.
 */
export function useTwoGateways(): () => TwoGateways {
  let setup: TwoGateways | undefined;
  let stack: TestStack | undefined;
  let second: Gateway | undefined;
  let fakeA: FakeUpstream | undefined;
  let fakeB: FakeUpstream | undefined;
  beforeAll(async () => {
    const started = await startChatStack({ PERMIT_CACHE_MS: "0" });
    ({ stack, fake: fakeA } = started);
    const { b, fakeB: secondFake } = await secondChatOffer(started.stack);
    fakeB = secondFake;
    second = await startGateway(started.stack.config, {
      logger: started.stack.logger,
      database: started.stack.database.db,
    });
    setup = { stack: started.stack, second, a: started.chatOffer, fakeA: started.fake, b, fakeB };
  }, 120_000);
  afterAll(async () => {
    await second?.close();
    await fakeB?.stop();
    await fakeA?.stop();
    await stack?.close();
  });
  return () => {
    if (setup === undefined) throw new Error("useTwoGateways: read only inside the tests");
    return setup;
  };
}

/** A `demo-chat` chat on the stack's demo permit, through `via` (default: the stack's gateway). */
export function demoChat(stack: () => TestStack) {
  return (body: object = {}, via?: Gateway) =>
    fetch(`${(via ?? stack().gateway).url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack().apiKey}`,
        "content-type": "application/json",
        "x-gateway-permit": stack().demo.permitId,
      },
      body: JSON.stringify({
        model: "demo-chat",
        messages: [{ role: "user", content: "hello gateway" }],
        ...body,
      }),
    });
}
