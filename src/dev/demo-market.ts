import { keccak256, stringToHex, type Address, type Hex } from "viem";
import type { AnvilAccount } from "../adapters/chain/anvil.js";
import { creditTokenAbi, marketAbi } from "../../gen/contracts/artifacts.js";
import type { ChainClients } from "../adapters/chain/clients.js";
import { deployCreditToken, deployMarket } from "../adapters/chain/deploy.js";
import { openPermit } from "../adapters/chain/permit-transactions.js";
import type { CatalogEntry } from "../domain/catalog.js";

/** Roles of the demo market, each a distinct funded account. */
export interface DemoAccounts {
  readonly deployer: AnvilAccount;
  readonly settlement: AnvilAccount;
  readonly creator: AnvilAccount;
  readonly operator: AnvilAccount;
  readonly payer: AnvilAccount;
}

export interface DemoOfferSpec {
  readonly offerId: Hex;
  readonly modelId: Hex;
  readonly status: "active" | "paused";
}

export interface DemoMarket {
  readonly market: Address;
  readonly deployBlock: bigint;
  readonly catalog: CatalogEntry[];
  readonly models: { id: string; modelId: Hex; creditToken: Address }[];
  readonly offers: DemoOfferSpec[];
  readonly permitId: Hex;
  readonly permitDeposit: bigint;
}

export const id32 = (label: string): Hex => keccak256(stringToHex(label));

export function demoAccounts(accounts: readonly AnvilAccount[]): DemoAccounts {
  const [deployer, settlement, creator, operator, payer] = accounts;
  if (!deployer || !settlement || !creator || !operator || !payer)
    throw new Error("need 5 accounts");
  return { deployer, settlement, creator, operator, payer };
}

/** The demo offers' published capabilities and tariff. */
export const demoTariff = {
  version: 0n,
  inputPricePerMTok: 2_000_000_000_000_000n,
  outputPricePerMTok: 6_000_000_000_000_000n,
  wakeFee: 10_000_000_000_000n,
} as const;

export function demoMetadata(region: string, hardware: string) {
  return {
    region,
    hardware,
    maxConcurrency: 8,
    capabilities: JSON.stringify({
      max_output_tokens: 4096,
      context_window: 8192,
      streaming: true,
    }),
  };
}

/** The demo models, in the order their ids are ranked on chain. */
const modelSpecs = [
  {
    id: "demo-chat",
    aliases: ["chat", "demo/chat"],
    repository: "demo/chat-small",
    task: "chat",
    symbol: "DCHAT",
  },
  {
    id: "demo-coder",
    aliases: ["coder"],
    repository: "demo/coder-small",
    task: "code",
    symbol: "DCODE",
  },
];

type DemoModel = DemoMarket["models"][number];
type Wallet = ReturnType<ChainClients["wallet"]>;

/** Waits for a demo transaction; a revert fails the seeding. */
async function confirmed(publicClient: ChainClients["publicClient"], hash: Hex) {
  const receipt = await publicClient.waitForTransactionReceipt({ hash });
  if (receipt.status !== "success") throw new Error(`demo transaction ${hash} reverted`);
  return receipt;
}

/**
 * Deploys the market and seeds a demo: two active models with credit tokens,
 * three offers (one paused), and a payer with an open permit on the first
 * model. Everything goes through the contract, as a real market would.
 */
export async function seedDemoMarket(
  clients: ChainClients,
  roles: DemoAccounts,
): Promise<DemoMarket> {
  const { publicClient } = clients;
  const deployer = clients.wallet(roles.deployer.privateKey);
  const creator = clients.wallet(roles.creator.privateKey);
  const operator = clients.wallet(roles.operator.privateKey);
  const payer = clients.wallet(roles.payer.privateKey);

  const market = await deployMarket(deployer, publicClient, {
    settlementOperator: roles.settlement.address,
    closeGracePeriod: 3600n,
  });
  const deployBlock = await publicClient.getBlockNumber();
  const models = await seedModels(clients, creator, roles, market);
  const [chat, coder] = models as [DemoModel, DemoModel];
  const offers = await seedOffers(clients, operator, roles, market, chat, coder);

  const permitId = id32("permit:demo");
  const permitDeposit = 100n * 10n ** 18n;
  await confirmed(
    publicClient,
    await creator.writeContract({
      address: chat.creditToken,
      abi: creditTokenAbi,
      functionName: "mint",
      args: [roles.payer.address, permitDeposit * 10n],
    }),
  );
  // The demo payer opens its permit as any payer does (the `gateway permit open` path).
  await openPermit(
    { publicClient, wallet: payer, market },
    {
      permitId,
      modelId: chat.modelId,
      deposit: permitDeposit,
      expiresAt: BigInt(Math.floor(Date.now() / 1000) + 30 * 24 * 3600),
    },
  );

  return {
    market,
    deployBlock,
    catalog: modelSpecs.map((spec, i) => ({
      id: spec.id,
      modelId: models[i]!.modelId,
      aliases: [...spec.aliases],
    })),
    models,
    offers,
    permitId,
    permitDeposit,
  };
}

/** The demo models, each with its own credit token, created and activated by the creator. */
async function seedModels(
  { publicClient }: ChainClients,
  creator: Wallet,
  roles: DemoAccounts,
  market: Address,
): Promise<DemoModel[]> {
  const models: DemoModel[] = [];
  for (const [index, spec] of modelSpecs.entries()) {
    const modelId = id32(`model:${spec.id}`);
    const creditToken = await deployCreditToken(creator, publicClient, {
      name: `${spec.id} credits`,
      symbol: spec.symbol,
      owner: roles.creator.address,
    });
    await confirmed(
      publicClient,
      await creator.writeContract({
        address: market,
        abi: marketAbi,
        functionName: "createModel",
        args: [
          modelId,
          creditToken,
          spec.repository,
          "v1",
          spec.task,
          id32(`pool:${spec.id}`),
          BigInt(index + 1),
        ],
      }),
    );
    await confirmed(
      publicClient,
      await creator.writeContract({
        address: market,
        abi: marketAbi,
        functionName: "setModelStatus",
        args: [modelId, 1],
      }),
    );
    models.push({ id: spec.id, modelId, creditToken });
  }
  return models;
}

/** The demo offers (two of the chat model, one paused; one of the coder), by the operator. */
async function seedOffers(
  { publicClient }: ChainClients,
  operator: Wallet,
  roles: DemoAccounts,
  market: Address,
  chat: DemoModel,
  coder: DemoModel,
): Promise<DemoOfferSpec[]> {
  const offerSpecs = [
    {
      label: "chat-eu",
      model: chat,
      region: "eu-west",
      hardware: "cpu",
      status: "active" as const,
    },
    {
      label: "chat-us",
      model: chat,
      region: "us-east",
      hardware: "gpu-a10",
      status: "paused" as const,
    },
    {
      label: "coder-eu",
      model: coder,
      region: "eu-west",
      hardware: "cpu",
      status: "active" as const,
    },
  ];
  const offers: DemoOfferSpec[] = [];
  for (const spec of offerSpecs) {
    const offerId = id32(`offer:${spec.label}`);
    await confirmed(
      publicClient,
      await operator.writeContract({
        address: market,
        abi: marketAbi,
        functionName: "createOffer",
        args: [
          offerId,
          spec.model.modelId,
          roles.operator.address,
          roles.operator.address,
          demoTariff,
          demoMetadata(spec.region, spec.hardware),
        ],
      }),
    );
    if (spec.status === "paused") {
      await confirmed(
        publicClient,
        await operator.writeContract({
          address: market,
          abi: marketAbi,
          functionName: "setOfferStatus",
          args: [offerId, 1],
        }),
      );
    }
    offers.push({ offerId, modelId: spec.model.modelId, status: spec.status });
  }
  return offers;
}
