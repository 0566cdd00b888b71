import { useSignal } from "@preact/signals";
import { useEffect, useRef } from "preact/hooks";
import { ApiError, request } from "../api.ts";
import { sessionProblem } from "../live.ts";
import { connectedCount, contactsChanged } from "../state.ts";
import type { Contact, ContactList } from "../types.ts";

const PAGE = 10;
type Field = "name" | "display_name" | "phone_number";
type Errors = Partial<Record<Field | "form", string>>;

/** An API error placed beside the field it is about (409: a duplicate name or phone number). */
function errorsOf(err: unknown, fallbackField: Field): Errors {
  if (sessionProblem(err)) return {};
  if (!(err instanceof ApiError)) return { form: "Something went wrong. Try again." };
  if (err.code === "CONTACT_EXISTS") return { [fallbackField]: "A contact with this name or phone number already exists." };
  if (err.code === "TOO_MANY_CONTACTS") return { form: err.message };
  if (err.status === 0) return { form: "The server cannot be reached. Try again in a moment." };
  const field = err.field as Field | undefined;
  if (field === "name" || field === "display_name" || field === "phone_number") return { [field]: err.message };
  return { form: err.message };
}

function Input(p: { id: string; label: string; value: string; error: string | undefined; onInput(v: string): void; type?: string; autoComplete?: string }) {
  return (
    <div class="field">
      <label for={p.id}>{p.label}</label>
      <input
        id={p.id}
        type={p.type ?? "text"}
        value={p.value}
        autoComplete={p.autoComplete ?? "off"}
        onInput={(e) => p.onInput((e.target as HTMLInputElement).value)}
        aria-invalid={p.error ? "true" : "false"}
        aria-describedby={`${p.id}-error`}
      />
      <p id={`${p.id}-error`} class="error" role="alert">
        {p.error ?? ""}
      </p>
    </div>
  );
}

function AddContact({ bearer, onAdded }: { bearer: string; onAdded(): void }) {
  const name = useSignal("");
  const display = useSignal("");
  const phone = useSignal("");
  const errors = useSignal<Errors>({});
  const busy = useSignal(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    busy.value = true;
    try {
      const body: Record<string, string> = { name: name.value.trim() };
      if (display.value.trim()) body.display_name = display.value.trim();
      if (phone.value.trim()) body.phone_number = phone.value.trim();
      await request<Contact>("POST", "/side-control/contacts", { bearer, body });
      name.value = display.value = phone.value = "";
      errors.value = {};
      onAdded();
    } catch (err) {
      errors.value = errorsOf(err, "name");
    } finally {
      busy.value = false;
    }
  };
  return (
    <form class="contact-form" onSubmit={submit} noValidate aria-labelledby="add-contact-heading">
      <h3 id="add-contact-heading">Add a contact</h3>
      <Input id="contact-name" label="Name" value={name.value} error={errors.value.name} onInput={(v) => (name.value = v)} />
      <Input id="contact-display-name" label="Display name" value={display.value} error={errors.value.display_name} onInput={(v) => (display.value = v)} />
      <Input id="contact-phone" label="Phone number" type="tel" value={phone.value} error={errors.value.phone_number} onInput={(v) => (phone.value = v)} />
      {errors.value.form && (
        <p class="error" role="alert">
          {errors.value.form}
        </p>
      )}
      <button type="submit" disabled={busy.value}>
        Add contact
      </button>
    </form>
  );
}

function ContactRow({ contact, bearer, onChanged }: { contact: Contact; bearer: string; onChanged(): void }) {
  const mode = useSignal<"view" | "edit" | "confirm">("view");
  const display = useSignal(contact.display_name ?? "");
  const phone = useSignal(contact.phone_number ?? "");
  const errors = useSignal<Errors>({});
  const path = `/side-control/contacts/${encodeURIComponent(contact.name)}`;
  const id = `c-${Array.from(new TextEncoder().encode(contact.name), (b) => b.toString(16)).join("")}`;
  const save = async (e: Event) => {
    e.preventDefault();
    try {
      await request<Contact>("PUT", path, { bearer, body: { display_name: display.value.trim() || null, phone_number: phone.value.trim() || null } });
      errors.value = {};
      mode.value = "view";
      onChanged();
    } catch (err) {
      errors.value = errorsOf(err, "phone_number");
    }
  };
  const remove = async () => {
    try {
      await request<Contact>("DELETE", path, { bearer });
      onChanged();
    } catch (err) {
      errors.value = errorsOf(err, "name");
      mode.value = "view";
    }
  };
  if (mode.value === "edit") {
    return (
      <li class="contact">
        <form onSubmit={save} noValidate aria-label={`Edit ${contact.name}`}>
          <p class="contact-name">{contact.name}</p>
          <Input id={`${id}-display`} label="Display name" value={display.value} error={errors.value.display_name} onInput={(v) => (display.value = v)} />
          <Input id={`${id}-phone`} label="Phone number" type="tel" value={phone.value} error={errors.value.phone_number} onInput={(v) => (phone.value = v)} />
          {errors.value.form && (
            <p class="error" role="alert">
              {errors.value.form}
            </p>
          )}
          <div class="actions">
            <button type="submit">Save</button>
            <button type="button" class="secondary" onClick={() => (mode.value = "view")}>
              Cancel
            </button>
          </div>
        </form>
      </li>
    );
  }
  return (
    <li class="contact">
      <div>
        <p class="contact-name">{contact.display_name ?? contact.name}</p>
        <p class="muted">
          {contact.display_name ? `${contact.name} · ` : ""}
          {contact.phone_number ?? "no phone number"}
        </p>
        {errors.value.name && (
          <p class="error" role="alert">
            {errors.value.name}
          </p>
        )}
      </div>
      {mode.value === "confirm" ? (
        <div class="actions">
          <button type="button" class="danger" onClick={remove}>
            Delete {contact.name}
          </button>
          <button type="button" class="secondary" onClick={() => (mode.value = "view")}>
            Keep
          </button>
        </div>
      ) : (
        <div class="actions">
          <button type="button" class="secondary" onClick={() => (mode.value = "edit")} aria-label={`Edit ${contact.name}`}>
            Edit
          </button>
          <button type="button" class="secondary" onClick={() => (mode.value = "confirm")} aria-label={`Delete ${contact.name}`}>
            Delete
          </button>
        </div>
      )}
    </li>
  );
}

/** Contacts: pages of the list (by name), add, edit and delete; re-read whenever they change on any phone. */
export function Contacts({ bearer }: { bearer: string }) {
  const page = useSignal<ContactList | undefined>(undefined);
  /** Cursors of the pages before the one shown (the first page has none). */
  const cursors = useSignal<Array<string | undefined>>([undefined]);
  const problem = useSignal<string | undefined>(undefined);
  const reloads = useSignal(0);
  const heading = useRef<HTMLHeadingElement>(null);
  const changes = contactsChanged.value;
  const reconnects = connectedCount.value;
  const cursor = cursors.value.at(-1);

  useEffect(() => {
    const abort = new AbortController();
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) q.set("cursor", cursor);
    request<ContactList>("GET", `/side-control/contacts?${q}`, { bearer, signal: abort.signal }).then(
      (list) => {
        problem.value = undefined;
        // A page emptied by deletions goes back one page.
        if (list.items.length === 0 && cursors.value.length > 1) cursors.value = cursors.value.slice(0, -1);
        else page.value = list;
      },
      (err: unknown) => {
        if ((err as Error)?.name === "AbortError" || sessionProblem(err)) return;
        problem.value = "The contacts could not be loaded.";
      },
    );
    return () => abort.abort();
  }, [bearer, cursor, changes, reconnects, reloads.value]);

  const reload = () => reloads.value++;
  const list = page.value;
  const pageNumber = cursors.value.length;
  return (
    <section class="card" aria-labelledby="contacts-heading">
      <h2 id="contacts-heading" ref={heading} tabIndex={-1}>
        Contacts
      </h2>
      {problem.value && (
        <p class="error" role="alert">
          {problem.value}
        </p>
      )}
      {list && list.items.length === 0 && pageNumber === 1 && <p class="muted">No contacts yet.</p>}
      {list && list.items.length > 0 && (
        <ul class="contacts" aria-label={`Contacts, page ${pageNumber}`}>
          {list.items.map((c) => (
            <ContactRow key={`${c.name}\u0000${c.display_name ?? ""}\u0000${c.phone_number ?? ""}`} contact={c} bearer={bearer} onChanged={reload} />
          ))}
        </ul>
      )}
      {(pageNumber > 1 || list?.has_next) && (
        <nav class="pager" aria-label="Contact pages">
          <button type="button" class="secondary" disabled={pageNumber === 1} onClick={() => (cursors.value = cursors.value.slice(0, -1))}>
            Previous page
          </button>
          <span class="muted">Page {pageNumber}</span>
          <button
            type="button"
            class="secondary"
            disabled={!list?.has_next}
            onClick={() => {
              if (list?.next_cursor) cursors.value = [...cursors.value, list.next_cursor];
            }}
          >
            Next page
          </button>
        </nav>
      )}
      <AddContact bearer={bearer} onAdded={reload} />
    </section>
  );
}
