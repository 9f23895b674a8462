import type { Logger } from "pino";
import type { Catalog } from "../domain/catalog.js";
import type { ModelRef, TokenCounters } from "../domain/tokens.js";
import type { TokenizerReadiness } from "../runtime/readiness.js";

/**
 * The token counters as the preloads read them: the port, and the adapter's list of the
 * tokenizers it is loading now (`loading()`, optional: without it, the preloads this module
 * started are what it knows of).
 */
export interface PreloadingCounters extends TokenCounters {
  loading?(): readonly string[];
  /** Stops what counting holds (its worker threads); absent: nothing to stop. */
  close?(): Promise<void>;
}

export interface TokenizerPreloads {
  /**
   * Loads the tokenizers of every model with an active offer that are not loaded yet: before the
   * gateway listens, and after each indexed change (an offer activated for a model whose
   * tokenizer was never loaded). Never rejects: a failed load is logged and its models stay
   * unroutable (routing asks `forModel`, which stays undefined), tried again by the next sweep.
   */
  sweep(): Promise<void>;
  /** Loads the tokenizers of models the indexer has just written (before their offers route). */
  preload(models: readonly ModelRef[]): Promise<void>;
  readiness(): TokenizerReadiness;
}

/**
 * Loaded before served (issue 35, item 5): the tokenizers a model's offers need are loaded at
 * start-up and when the indexer adds the model, never on a request's path. Until its tokenizer
 * is loaded a model is listed by the catalog but not routable (the catalog's routing view asks
 * `forModel`); `/ready` is not ready while a tokenizer of a model with an active offer loads.
 */
export function createTokenizerPreloads(deps: {
  readonly tokens: PreloadingCounters;
  readonly catalog: Pick<Catalog, "listModels">;
  readonly logger: Logger;
}): TokenizerPreloads {
  const { tokens, logger } = deps;
  // Tokenizers the active offers' models need (the last sweep's), and what this module loads.
  let needed = new Set<string>();
  const pending = new Map<string, Promise<void>>();
  const failed = new Set<string>();

  const loadOne = (tokenizer: string, models: readonly ModelRef[]): Promise<void> => {
    const running = pending.get(tokenizer);
    if (running !== undefined) return running;
    const started = performance.now();
    // A counter that throws instead of rejecting fails the same way (logged, not routable).
    const load = Promise.resolve()
      .then(() => tokens.preload(models))
      .then(
        () => {
          failed.delete(tokenizer);
          logger.info(
            { tokenizer, ms: Math.round(performance.now() - started) },
            "tokenizer preloaded",
          );
        },
        (error: unknown) => {
          failed.add(tokenizer);
          logger.error(
            {
              tokenizer,
              models: models.map((m) => `${m.repository}@${m.revision}`),
              error: error instanceof Error ? error.message.split("\n")[0] : String(error),
            },
            "tokenizer failed to load: its models stay unroutable",
          );
        },
      );
    const tracked = load.finally(() => pending.delete(tokenizer));
    pending.set(tokenizer, tracked);
    return tracked;
  };

  /** The models' tokenizers not loaded yet, each loaded once (models grouped by tokenizer). */
  const preload = async (models: readonly ModelRef[]): Promise<void> => {
    const byTokenizer = new Map<string, ModelRef[]>();
    for (const model of models) {
      const metering = tokens.meteringOf(model);
      if (metering.kind !== "exact" || tokens.forModel(model) !== undefined) continue;
      const group = byTokenizer.get(metering.tokenizer) ?? [];
      group.push(model);
      byTokenizer.set(metering.tokenizer, group);
    }
    await Promise.all([...byTokenizer].map(([tokenizer, group]) => loadOne(tokenizer, group)));
  };
  /** Never rejects: what the counters throw is logged (the models stay unroutable). */
  const safely = (what: string, run: () => Promise<void>): Promise<void> =>
    Promise.resolve()
      .then(run)
      .catch((error: unknown) =>
        logger.error(
          { error: error instanceof Error ? error.message.split("\n")[0] : String(error) },
          `${what} failed: the models concerned stay unroutable until the next change`,
        ),
      );

  const sweep = async (): Promise<void> => {
    const models = await deps.catalog.listModels("active");
    const served = models.filter((m) => m.activeOffers > 0 && m.quarantineReason === undefined);
    needed = new Set(
      served.flatMap((m) => {
        const metering = tokens.meteringOf(m);
        return metering.kind === "exact" ? [metering.tokenizer] : [];
      }),
    );
    await preload(served);
  };

  return {
    preload: (models) => safely("preloading tokenizers", () => preload(models)),
    sweep: () => safely("preloading the active offers' tokenizers", sweep),
    readiness() {
      const loading = [...new Set([...(tokens.loading?.() ?? []), ...pending.keys()])].sort();
      return {
        ok: !loading.some((name) => needed.has(name)),
        loading,
        failed: [...failed].sort(),
      };
    },
  };
}
