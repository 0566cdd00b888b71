import { base64urlnopad } from "@scure/base";
import { type Contact, type ContactCreate, type ContactList, ContactName, type ContactUpdate } from "../protocol/public.ts";
import type { ContactRow } from "../store/contacts.ts";
import type { DomainContext } from "./context.ts";
import { DomainError } from "./errors.ts";

export const DEFAULT_CONTACT_PAGE = 50;

/** A device's contacts, managed by its Side Control. */
export class ContactService {
  private readonly ctx: DomainContext;

  constructor(ctx: DomainContext) {
    this.ctx = ctx;
  }

  /** Pages by name; the cursor is the last name of the previous page, base64url-encoded. */
  async list(deviceKey: string, cursor: string | undefined, limit = DEFAULT_CONTACT_PAGE): Promise<ContactList> {
    let after: string | undefined;
    if (cursor !== undefined) {
      try {
        after = ContactName.parse(new TextDecoder("utf-8", { fatal: true }).decode(base64urlnopad.decode(cursor)));
      } catch {
        throw new DomainError("invalid", "INVALID_CONTACT", "cursor is not one this server issued", { field: "cursor" });
      }
    }
    const rows = await this.ctx.store.read((r) => r.contacts.list(deviceKey, after, limit + 1));
    const items = rows.slice(0, limit).map(contactView);
    const last = items.at(-1);
    const hasNext = rows.length > limit && last !== undefined;
    return hasNext ? { items, has_next: true, next_cursor: base64urlnopad.encode(new TextEncoder().encode(last.name)) } : { items, has_next: false };
  }

  async get(deviceKey: string, name: string): Promise<Contact> {
    const row = isContactName(name) ? await this.ctx.store.read((r) => r.contacts.get(deviceKey, name)) : undefined;
    if (!row) throw notFound(name);
    return contactView(row);
  }

  async create(deviceKey: string, input: ContactCreate): Promise<Contact> {
    const now = this.ctx.clock.now();
    const row: ContactRow = {
      public_key: deviceKey,
      name: input.name,
      ...fields(input.display_name ?? null, input.phone_number ?? null),
      created_at: now,
      updated_at: now,
    };
    const max = this.ctx.config.limits.contacts_per_device;
    const inserted = await this.ctx.store.transaction(async (tx) => {
      await tx.locks.take(`contacts:${deviceKey}`);
      if ((await tx.contacts.count(deviceKey)) >= max) {
        throw new DomainError("conflict", "TOO_MANY_CONTACTS", `a device may have at most ${max} contacts; delete one first`, { limit: max });
      }
      return tx.contacts.insert(row);
    });
    if (!inserted) throw exists();
    this.ctx.events.contacts(deviceKey, row.name, "created");
    return contactView(row);
  }

  /** Absent fields keep their value; `null` or blank clears one. */
  async update(deviceKey: string, name: string, input: ContactUpdate): Promise<Contact> {
    if (!isContactName(name)) throw notFound(name);
    const updated = await this.ctx.store.transaction(async (tx) => {
      const current = await tx.contacts.getForUpdate(deviceKey, name);
      if (!current) throw notFound(name);
      const keep = <T>(value: T | undefined, stored: T) => (value === undefined ? stored : value);
      const row: ContactRow = {
        ...current,
        ...fields(keep(input.display_name, current.display_name), keep(input.phone_number, current.phone_number)),
        updated_at: this.ctx.clock.now(),
      };
      const outcome = await tx.contacts.update(row);
      if (outcome === "missing") throw notFound(name);
      if (outcome === "conflict") throw exists();
      return contactView(row);
    });
    this.ctx.events.contacts(deviceKey, updated.name, "updated");
    return updated;
  }

  async delete(deviceKey: string, name: string): Promise<Contact> {
    const row = isContactName(name) ? await this.ctx.store.transaction((tx) => tx.contacts.delete(deviceKey, name)) : undefined;
    if (!row) throw notFound(name);
    this.ctx.events.contacts(deviceKey, row.name, "deleted");
    return contactView(row);
  }
}

/** Trims both fields, requires one of them, and derives the digits the phone number is unique by. */
function fields(displayName: string | null, phoneNumber: string | null) {
  const display_name = displayName?.trim() || null;
  const phone_number = phoneNumber?.trim() || null;
  if (display_name === null && phone_number === null) {
    throw new DomainError("invalid", "INVALID_CONTACT", "a contact needs a display_name or a phone_number", { field: "display_name" });
  }
  return { display_name, phone_number, phone_digits: phone_number?.replace(/\D/g, "") ?? null };
}

/** Whether a contact could have this name; any other name is simply not found. */
function isContactName(name: string): boolean {
  return ContactName.safeParse(name).success;
}

function contactView(row: ContactRow): Contact {
  const c: Contact = { name: row.name, created_at: new Date(row.created_at).toISOString(), updated_at: new Date(row.updated_at).toISOString() };
  if (row.display_name !== null) c.display_name = row.display_name;
  if (row.phone_number !== null) c.phone_number = row.phone_number;
  return c;
}

function notFound(name: string): DomainError {
  return new DomainError("not_found", "CONTACT_NOT_FOUND", `no contact named ${JSON.stringify(name)}`);
}

function exists(): DomainError {
  return new DomainError("conflict", "CONTACT_EXISTS", "a contact with this name or phone number already exists");
}
