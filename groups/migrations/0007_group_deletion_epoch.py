from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('groups', '0006_h11a_join_batching'),
    ]

    operations = [
        migrations.AddField(
            model_name='group',
            name='deletion_epoch',
            field=models.BigIntegerField(default=0, editable=False),
        ),
    ]
