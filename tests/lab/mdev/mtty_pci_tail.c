/*
 * mtty_pci: the kernel's mtty sample (samples/vfio-mdev/mtty.c, above this
 * part; tests/lab/lab.sh appends this file to a copy of it) with a PCI
 * function as its mdev parent instead of a virtual "mtty" device: it binds
 * QEMU's emulated "edu" device (1234:11e8) and registers the same two types
 * on it, so the parent is /sys/class/mdev_bus/<PCI address> and libvirt lists
 * it as pci_<address> with mdev_types, as Nova's libvirt driver and the
 * agent's sysfs driver require. Types: mtty_pci-1 (one port), mtty_pci-2.
 *
 * Every edu function is a parent of its own (the lab has two, so that a
 * profile change can move a vGPU to another parent): the mdev core embeds a
 * kobject in each struct mdev_type it registers, so each parent gets its own
 * copy of mtty.c's static mtty_types (which mtty.c itself registers once,
 * on its single virtual parent). The ports (MAX_MTTYS) stay one pool.
 *
 * No MODULE_DEVICE_TABLE: the module is loaded on purpose (modules-load.d),
 * never by udev for any edu device.
 */
#include <linux/pci.h>

struct mtty_pci_parent {
	struct mdev_parent parent;
	struct mtty_type types[ARRAY_SIZE(mtty_types)];
	struct mdev_type *mdev_types[ARRAY_SIZE(mtty_types)];
};

static int mtty_pci_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct mtty_pci_parent *p;
	unsigned int i;
	int ret;

	p = devm_kzalloc(&pdev->dev, sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	for (i = 0; i < ARRAY_SIZE(mtty_types); i++) {
		p->types[i] = mtty_types[i];
		p->mdev_types[i] = &p->types[i].type;
	}
	ret = mdev_register_parent(&p->parent, &pdev->dev, &mtty_driver,
				   p->mdev_types, ARRAY_SIZE(p->mdev_types));
	if (ret)
		return ret;
	pci_set_drvdata(pdev, p);
	dev_info(&pdev->dev, "mtty_pci: mdev parent registered\n");
	return 0;
}

static void mtty_pci_remove(struct pci_dev *pdev)
{
	struct mtty_pci_parent *p = pci_get_drvdata(pdev);

	mdev_unregister_parent(&p->parent);
}

static const struct pci_device_id mtty_pci_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) }, /* QEMU's edu */
	{ }
};

static struct pci_driver mtty_pci_driver = {
	.name = "mtty_pci",
	.id_table = mtty_pci_ids,
	.probe = mtty_pci_probe,
	.remove = mtty_pci_remove,
};

static int __init mtty_pci_init(void)
{
	int ret;

	ret = mdev_register_driver(&mtty_driver);
	if (ret)
		return ret;
	ret = pci_register_driver(&mtty_pci_driver);
	if (ret)
		mdev_unregister_driver(&mtty_driver);
	return ret;
}

static void __exit mtty_pci_exit(void)
{
	pci_unregister_driver(&mtty_pci_driver);
	mdev_unregister_driver(&mtty_driver);
}

module_init(mtty_pci_init)
module_exit(mtty_pci_exit)
