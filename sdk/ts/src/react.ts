// sluice-client/react: a provider and hooks over useSyncExternalStore.

import { createContext, createElement, useContext, useEffect, useState, useSyncExternalStore, type ReactNode } from "react";
import type { Client, Params } from "./types.js";
import { LiveQueryStore, TopicStore, type LiveQueryState, type TopicState } from "./store.js";

const Ctx = createContext<Client | null>(null);

export function SluiceProvider(props: { client: Client; children?: ReactNode }) {
  return createElement(Ctx.Provider, { value: props.client }, props.children);
}

/** The client given to the nearest SluiceProvider. */
export function useSluice(): Client {
  const c = useContext(Ctx);
  if (!c) throw new Error("sluice-client/react: useSluice needs a <SluiceProvider client={…}> above it");
  return c;
}

/**
 * A live query: `{rows, status, error}`. When `sql`/`params` change, the previous rows stay
 * (status "loading") until the new snapshot arrives.
 */
export function useLiveQuery<Row = Record<string, unknown>>(sql: string, params?: Params): LiveQueryState<Row> {
  const client = useSluice();
  const [store] = useState(() => new LiveQueryStore<Row>(client));
  store.setClient(client);
  const key = JSON.stringify([sql, params ?? null]);
  useEffect(() => {
    store.setQuery(sql, params);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [store, key]);
  useEffect(() => () => store.close(), [store]);
  return useSyncExternalStore(store.subscribe, store.getSnapshot, store.getSnapshot);
}

/** A topic watch: `{records, status, error}` (the newest `keep` records, default 1000). */
export function useTopic<Data = unknown>(topic: string, options?: { from?: number; tags?: string[]; keep?: number }): TopicState<Data> {
  const client = useSluice();
  const [store] = useState(() => new TopicStore<Data>(client));
  store.setClient(client);
  const key = JSON.stringify([topic, options ?? {}]);
  useEffect(() => {
    store.setTopic(topic, options ?? {});
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [store, key]);
  useEffect(() => () => store.close(), [store]);
  return useSyncExternalStore(store.subscribe, store.getSnapshot, store.getSnapshot);
}

export type { LiveQueryState, TopicState };
