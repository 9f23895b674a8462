import { randomBytes } from "node:crypto";
import { zeroHash, type Hex } from "viem";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import { deployCreditToken } from "../../src/adapters/chain/deploy.js";
import { demoMetadata, demoTariff, id32, type DemoOfferSpec } from "../../src/dev/demo-market.js";
import type { BenchMarket } from "./setup.js";

/**
 * `npm run bench:agent`'s market (issue 35): the bench's demo market (`seedBenchMarket`) plus one
 * model per embedded tokenizer the demo does not use (the demo's two models are Qwen 3's), each
 * with an active offer, a credit token and a permit of the demo payer; and every active offer's
 * capabilities widened for an 8,000-token prompt and the hard answers (the demo's
 * `context_window` is 8,192 and `max_output_tokens` 4,096).
 */

/** A model per embedded tokenizer family, by a repository of the registry's (registry.json). */
export const tokenizerModels: readonly { id: string; repository: string; tokenizer: string }[] = [
  { id: "demo-chat", repository: "demo/chat-small", tokenizer: "qwen3" },
  { id: "bench-llama3", repository: "meta-llama/Meta-Llama-3-8B-Instruct", tokenizer: "llama3" },
  { id: "bench-llama3.1", repository: "meta-llama/Llama-3.1-8B-Instruct", tokenizer: "llama3.1" },
  { id: "bench-gemma3", repository: "google/gemma-3-27b-it", tokenizer: "gemma3" },
  { id: "bench-deepseek-v3", repository: "deepseek-ai/DeepSeek-V3", tokenizer: "deepseek-v3" },
  { id: "bench-gpt-oss", repository: "openai/gpt-oss-20b", tokenizer: "gpt-oss" },
];

export interface AgentMarketModel {
  readonly id: string;
  readonly modelId: Hex;
  readonly repository: string;
  readonly tokenizer: string;
  /** The demo payer's permit on this model (the bench permit for demo-chat). */
  readonly permitId: Hex;
}

export interface AgentMarket {
  readonly models: AgentMarketModel[];
  /** The catalog file's entries: the demo's and the added models'. */
  readonly catalog: { id: string; modelId: Hex; aliases: string[] }[];
  /** The demo's offers and the added ones (all active but the demo's paused one). */
  readonly offers: DemoOfferSpec[];
}

export const agentCapabilities = JSON.stringify({
  max_output_tokens: 16384,
  context_window: 131072,
  streaming: true,
});

export async function seedAgentModels(
  market: BenchMarket,
  opts: { maxConcurrency: number; deposit: bigint },
): Promise<AgentMarket> {
  const { clients, roles, demo } = market;
  const { publicClient } = clients;
  const confirm = async (hash: Hex): Promise<void> => {
    const receipt = await publicClient.waitForTransactionReceipt({ hash });
    if (receipt.status !== "success") throw new Error(`bench transaction ${hash} reverted`);
  };
  const operator = clients.wallet(roles.operator.privateKey);
  const creator = clients.wallet(roles.creator.privateKey);
  const payer = clients.wallet(roles.payer.privateKey);
  const metadata = {
    ...demoMetadata("eu-west", "cpu"),
    maxConcurrency: opts.maxConcurrency,
    capabilities: agentCapabilities,
  };
  for (const offer of demo.offers.filter((o) => o.status === "active")) {
    await confirm(
      await operator.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "setOfferMetadata",
        args: [offer.offerId, metadata],
      }),
    );
  }

  const chat = demo.models.find((m) => m.id === "demo-chat")!;
  const models: AgentMarketModel[] = [
    {
      id: "demo-chat",
      modelId: chat.modelId,
      repository: "demo/chat-small",
      tokenizer: "qwen3",
      permitId: market.permitId,
    },
  ];
  const catalog = demo.catalog.map((c) => ({
    id: c.id,
    modelId: c.modelId,
    aliases: [...c.aliases],
  }));
  const offers = [...demo.offers];
  let rank = demo.models.length;
  for (const spec of tokenizerModels.filter((m) => m.id !== "demo-chat")) {
    const modelId = id32(`model:${spec.id}`);
    const creditToken = await deployCreditToken(creator, publicClient, {
      name: `${spec.id} credits`,
      symbol: "BENCH",
      owner: roles.creator.address,
    });
    await confirm(
      await creator.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "createModel",
        args: [
          modelId,
          creditToken,
          spec.repository,
          "v1",
          "chat",
          id32(`pool:${spec.id}`),
          BigInt(++rank),
        ],
      }),
    );
    await confirm(
      await creator.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "setModelStatus",
        args: [modelId, 1],
      }),
    );
    const offerId = id32(`offer:${spec.id}`);
    await confirm(
      await operator.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "createOffer",
        args: [
          offerId,
          modelId,
          roles.operator.address,
          roles.operator.address,
          demoTariff,
          metadata,
        ],
      }),
    );
    offers.push({ offerId, modelId, status: "active" });
    await confirm(
      await creator.writeContract({
        address: creditToken,
        abi: creditTokenAbi,
        functionName: "mint",
        args: [roles.payer.address, opts.deposit],
      }),
    );
    await confirm(
      await payer.writeContract({
        address: creditToken,
        abi: creditTokenAbi,
        functionName: "approve",
        args: [demo.market, opts.deposit],
      }),
    );
    const permitId = id32(`permit:bench:${spec.id}:${randomBytes(8).toString("hex")}`);
    await confirm(
      await payer.writeContract({
        address: demo.market,
        abi: marketAbi,
        functionName: "openPermit",
        args: [
          permitId,
          modelId,
          zeroHash,
          opts.deposit,
          BigInt(Math.floor(Date.now() / 1000) + 24 * 3600),
        ],
      }),
    );
    catalog.push({ id: spec.id, modelId, aliases: [] });
    models.push({ ...spec, modelId, permitId });
  }
  return { models, catalog, offers };
}
