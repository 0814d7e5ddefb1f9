"""Run one Nova service of vgpu-bridge's real-Nova tests (tests/novaharness).

    /usr/bin/python3 launcher.py SERVICE --config-file nova.conf [...]

SERVICE is api, conductor, scheduler, compute or manage (then the rest of
the arguments are nova-manage's). Before handing over to
nova.cmd.<service>.main() it installs Nova's own GlanceFixture and
NeutronFixture (nova.tests.fixtures) in this process, so no Glance or
Neutron is needed.

In nova-compute (compute_driver = fake.FakeDriver) it also wraps the fake
driver's spawn, destroy, power_off, power_on, finish_revert_migration and
the live migration calls (live_migration on the source, which a failed
hook turns into a rollback; post_live_migration_at_destination;
post_live_migration on the source) so that each, after doing its own
work, POSTs what it did to NOVATEST_HOOK_URL and waits for the answer: the Go harness then plays
Nova's libvirt driver on the host's simulated host (mdevs, domain). A
failed hook fails the driver call, as a libvirt error would.

A compute added with AddPCIHost also reports PCI devices (the fake host's
PF and VFs) from its get_available_resource, as Nova's own
FakeDriverWithPciResources does (_add_pci_devices).
"""

import json
import os
import sys
import urllib.request

SERVICE = sys.argv[1] if len(sys.argv) > 1 else ""
del sys.argv[1:2]
sys.argv[0] = "nova-" + SERVICE

if SERVICE == "api":
    from nova.cmd import api as cmd
elif SERVICE == "conductor":
    from nova.cmd import conductor as cmd
elif SERVICE == "scheduler":
    from nova.cmd import scheduler as cmd
elif SERVICE == "compute":
    from nova.cmd import compute as cmd
elif SERVICE == "manage":
    from nova.cmd import manage as cmd
else:
    sys.exit("launcher.py: unknown service %r (api, conductor, scheduler, compute, manage)" % SERVICE)

import fixtures  # noqa: E402
import nova.conf  # noqa: E402
from nova.tests import fixtures as nova_fixtures  # noqa: E402

CONF = nova.conf.CONF


class _Host(object):
    """The small part of a nova.test.TestCase the fixtures use."""

    def useFixture(self, f):
        f.setUp()
        return f

    def stub_out(self, old, new):
        self.useFixture(fixtures.MonkeyPatch(old, new))

    def flags(self, **kw):
        group = kw.pop("group", None)
        for k, v in kw.items():
            CONF.set_override(k, v, group)


def _vgpu_first(allocations):
    """The one VGPU allocation Nova 26's libvirt driver serves: LibvirtDriver.
    _vgpu_allocations keeps the providers with VGPU in the dict's own order
    and _allocate_mdevs looks up only the first (next(iter(...))), in
    nova/virt/libvirt/driver.py. Go's maps lose that order, so it is
    picked here."""
    for rp, alloc in (allocations or {}).items():
        n = (alloc.get("resources") or {}).get("VGPU", 0)
        if n > 0:
            return {"provider": rp, "count": n}
    return None


class _Unavailable(Exception):
    """The hook answered 409: what libvirt's driver raises as
    ComputeResourcesUnavailable."""


def _hook(event, instance, allocations=None, dest=None):
    url = os.environ.get("NOVATEST_HOOK_URL")
    if not url:
        return
    body = {
        "event": event,
        "host": CONF.host,
        "instance_uuid": instance.uuid,
        "instance_name": instance.name,
        "allocations": allocations,
        "vgpu_first": _vgpu_first(allocations),
        "dest": dest,
    }
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        if e.code == 409:
            raise _Unavailable(e.read().decode(errors="replace"))
        raise RuntimeError("novatest hook %s for %s: %s %s" % (event, instance.uuid, e.code, e.read().decode(errors="replace")))


def _domains():
    """The instance uuids with a domain on this host's fake host."""
    url = os.environ.get("NOVATEST_HOOK_URL")
    if not url:
        return []
    req = urllib.request.Request(url, data=json.dumps({"event": "list", "host": CONF.host}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"[]")


def _wrap_fake_driver():
    from nova import exception
    from nova.virt import fake

    d = fake.FakeDriver
    spawn, destroy = d.spawn, d.destroy
    power_off, power_on = d.power_off, d.power_on
    revert = d.finish_revert_migration
    live = d.live_migration
    post_live = d.post_live_migration

    def _spawn(self, context, instance, image_meta, injected_files, admin_password, allocations, *a, **kw):
        spawn(self, context, instance, image_meta, injected_files, admin_password, allocations, *a, **kw)
        power = kw.get("power_on", a[2] if len(a) > 2 else True)
        try:
            _hook("spawn" if power else "spawn_stopped", instance, allocations)
        except _Unavailable as e:
            # LibvirtDriver._allocate_mdevs: a VGPU allocation on a provider
            # not in this host's tree raises ComputeResourcesUnavailable
            # before any guest exists (an evacuation then fails and Nova
            # keeps the instance where it was: ComputeManager.rebuild_instance).
            destroy(self, context, instance, None)
            raise exception.ComputeResourcesUnavailable(reason=str(e))

    def _destroy(self, context, instance, *a, **kw):
        destroy(self, context, instance, *a, **kw)
        _hook("destroy", instance)

    def _power_off(self, instance, *a, **kw):
        power_off(self, instance, *a, **kw)
        _hook("power_off", instance)

    def _power_on(self, context, instance, *a, **kw):
        power_on(self, context, instance, *a, **kw)
        _hook("power_on", instance)

    def _revert(self, context, instance, *a, **kw):
        revert(self, context, instance, *a, **kw)
        _hook("revert", instance)

    def _live_migration(self, context, instance, dest, post_method, recover_method,
                        block_migration=False, migrate_data=None):
        # On the source, before the move: a failed hook is a failed
        # migration, which libvirt's driver answers by calling
        # recover_method (Nova's _rollback_live_migration: the instance
        # stays ACTIVE on its source, its allocations return to it).
        try:
            _hook("live_migration", instance, dest=dest)
        except RuntimeError:
            recover_method(context, instance, dest, migrate_data)
            return
        live(self, context, instance, dest, post_method, recover_method,
             block_migration, migrate_data)

    def _at_dest(self, context, instance, network_info, block_migration=False,
                 block_device_info=None):
        # FakeDriver's own spawns the guest here; the unwrapped spawn, so
        # the hook sees a live_migration_dest rather than a spawn.
        spawn(self, context, instance, None, None, None, None)
        _hook("live_migration_dest", instance)

    def _post_live(self, context, instance, block_device_info, migrate_data=None):
        # On the source once the guest runs on the destination.
        post_live(self, context, instance, block_device_info, migrate_data)
        self.instances.pop(instance.uuid, None)
        _hook("live_migration_source", instance)

    reboot = d.reboot
    list_uuids = d.list_instance_uuids

    def _reboot(self, context, instance, network_info, reboot_type, block_device_info=None,
                bad_volumes_callback=None, accel_info=None):
        # FakeDriver.reboot powers the guest on through power_on (which
        # the harness would see as a start of a running domain): the
        # unwrapped one here, and the hook sees the reboot itself.
        if instance.uuid not in self.instances and reboot_type.lower() == "hard":
            spawn(self, context, instance, instance.image_meta, None, None, None,
                  block_device_info=block_device_info)
        else:
            power_on(self, context, instance, network_info, block_device_info=block_device_info)
        _hook("reboot_" + reboot_type.lower(), instance)

    def _list_uuids(self):
        # A restarted nova-compute's FakeDriver knows no guest; libvirt
        # lists the host's domains (Host.list_instance_domains), which
        # ComputeManager._destroy_evacuated_instances needs to find the
        # guest an evacuation left on this host.
        uuids = list_uuids(self)
        for u in _domains():
            if u not in uuids:
                uuids.append(u)
        return uuids

    migrate_off = d.migrate_disk_and_power_off

    def _migrate_off(self, context, instance, dest, *a, **kw):
        # LibvirtDriver.migrate_disk_and_power_off powers the source guest
        # off; it stays defined (with its mdevs) for a revert.
        out = migrate_off(self, context, instance, dest, *a, **kw)
        _hook("power_off", instance)
        return out

    d.migrate_disk_and_power_off = _migrate_off
    d.reboot = _reboot
    d.list_instance_uuids = _list_uuids
    d.live_migration = _live_migration
    d.post_live_migration_at_destination = _at_dest
    d.post_live_migration = _post_live
    d.spawn, d.destroy = _spawn, _destroy
    d.power_off, d.power_on = _power_off, _power_on
    d.finish_revert_migration = _revert
    _add_pci_devices(d)


def _add_pci_devices(d):
    """Report the host's PCI devices when the harness listed some.

    As nova.virt.fake.FakeDriverWithPciResources.get_available_resource
    does: the resources FakeDriver reports plus pci_passthrough_devices, a
    JSON list of device dicts (address, vendor_id, product_id, dev_type,
    parent_addr, numa_node, label, ...), here read from
    pci-devices-<host>.json next to this file (tests/novaharness
    AddPCIHost). Nova's resource tracker then tracks the devices that
    [pci] device_spec matches and, with [pci] report_in_placement, puts
    one provider per PF under the compute node
    (nova.compute.pci_placement_translator).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    available = d.get_available_resource

    def _get_available_resource(self, nodename):
        host_status = available(self, nodename)
        # (CONF is parsed by now, not when the driver is wrapped.)
        path = os.path.join(here, "pci-devices-%s.json" % CONF.host)
        if os.path.exists(path):
            with open(path) as f:
                devs = json.load(f)
            for dev in devs:
                dev.setdefault("status", "available")
            host_status["pci_passthrough_devices"] = json.dumps(devs)
        return host_status

    d.get_available_resource = _get_available_resource


def _add_images(glance):
    """Adds the images NOVATEST_IMAGES lists (a JSON file: a list of
    GlanceFixture image dicts, each with an optional "file" whose bytes are
    the image's data) to this process's GlanceFixture. Every service of a
    run reads the same file, so nova-api shows the images that nova-compute
    downloads (GlanceFixture.download returns the data given to create)."""
    path = os.environ.get("NOVATEST_IMAGES")
    if not path:
        return
    with open(path) as f:
        images = json.load(f)
    for meta in images:
        meta = dict(meta)
        src = meta.pop("file", None)
        meta.setdefault("status", "active")
        meta.setdefault("visibility", "public")
        meta.setdefault("deleted", False)
        meta.setdefault("min_ram", 0)
        meta.setdefault("min_disk", 0)
        meta.setdefault("protected", False)
        meta.setdefault("tags", [])
        meta.setdefault("created_at", glance.timestamp)
        meta.setdefault("updated_at", glance.timestamp)
        if src:
            meta.setdefault("size", os.path.getsize(src))
        if src and SERVICE == "compute":
            with open(src, "rb") as data:
                glance.create(None, meta, data=data)
        else:
            glance.create(None, meta)


def _share_images(glance):
    """Shares the images a service creates from now on (a shelve's
    snapshot: nova-api creates it, the conductor reads it for the unshelve,
    the unshelving compute deletes it) with every service of the run,
    through NOVATEST_GLANCE_DIR: each service's GlanceFixture lives in its
    own process, so without this an unshelve cannot find the snapshot. The
    images of NOVATEST_IMAGES and the fixture's own stay per process (each
    service made the same)."""
    import pickle

    d = os.environ.get("NOVATEST_GLANCE_DIR")
    if not d:
        return
    os.makedirs(d, exist_ok=True)
    create, show, update, delete = glance.create, glance.show, glance.update, glance.delete

    def path(image_id):
        return os.path.join(d, str(image_id) + ".pickle")

    def save(meta):
        tmp = path(meta["id"]) + ".%d.tmp" % os.getpid()
        with open(tmp, "wb") as f:
            pickle.dump(meta, f)
        os.replace(tmp, path(meta["id"]))

    def load(image_id):
        # The shared copy, when there is one, is the newest.
        try:
            with open(path(image_id), "rb") as f:
                glance.images[str(image_id)] = pickle.load(f)
        except FileNotFoundError:
            pass

    def _create(context, metadata, data=None):
        out = create(context, metadata, data)
        save(out)
        return out

    def _show(context, image_id, *a, **kw):
        load(image_id)
        return show(context, image_id, *a, **kw)

    def _update(context, image_id, metadata, *a, **kw):
        load(image_id)
        out = update(context, image_id, metadata, *a, **kw)
        if os.path.exists(path(image_id)):
            save(out)
        return out

    def _delete(context, image_id):
        load(image_id)
        try:
            os.remove(path(image_id))
        except FileNotFoundError:
            pass
        return delete(context, image_id)

    glance.create, glance.show, glance.update, glance.delete = _create, _show, _update, _delete


def main():
    if SERVICE != "manage":
        host = _Host()
        glance = host.useFixture(nova_fixtures.GlanceFixture(host))
        _add_images(glance)
        _share_images(glance)
        host.useFixture(nova_fixtures.NeutronFixture(host))
    if SERVICE == "compute":
        _wrap_fake_driver()
    return cmd.main()


if __name__ == "__main__":
    sys.exit(main())
