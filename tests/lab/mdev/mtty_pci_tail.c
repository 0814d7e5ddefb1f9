/*
 * mtty_pci: the kernel's mtty sample (samples/vfio-mdev/mtty.c, above this
 * part; tests/lab/lab.sh appends this file to a copy of it) with a PCI
 * function as its mdev parent instead of a virtual "mtty" device: it binds
 * QEMU's emulated "edu" device (1234:11e8) and registers the same two types
 * on it, so the parent is /sys/class/mdev_bus/<PCI address> and libvirt lists
 * it as pci_<address> with mdev_types, as Nova's libvirt driver and the
 * agent's sysfs driver require. Types: mtty_pci-1 (one port), mtty_pci-2.
 *
 * No MODULE_DEVICE_TABLE: the module is loaded on purpose (modules-load.d),
 * never by udev for any edu device.
 */
#include <linux/pci.h>

static int mtty_pci_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct mdev_parent *parent;
	int ret;

	parent = devm_kzalloc(&pdev->dev, sizeof(*parent), GFP_KERNEL);
	if (!parent)
		return -ENOMEM;
	ret = mdev_register_parent(parent, &pdev->dev, &mtty_driver,
				   mtty_mdev_types, ARRAY_SIZE(mtty_mdev_types));
	if (ret)
		return ret;
	pci_set_drvdata(pdev, parent);
	dev_info(&pdev->dev, "mtty_pci: mdev parent registered\n");
	return 0;
}

static void mtty_pci_remove(struct pci_dev *pdev)
{
	mdev_unregister_parent(pci_get_drvdata(pdev));
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
